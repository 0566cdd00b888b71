import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import { RpcMethod } from "../src/protocol/gen/rpc_pb.ts";
import { commonHandlers, RpcCode, RpcError } from "../src/protocol/rpc.ts";
import { checkTimings } from "../src/transport/timings.ts";
import { startTestServer, type TestServer } from "./support/server.ts";
import { UdpRelay } from "./support/udp-relay.ts";
import { connect, eventually } from "./support/webrtc.ts";

/**
 * Liveness: a device quiet for `livenessQuietMs` is asked `all.ping`; one that does not answer
 * within `livenessProbeTimeoutMs` is closed and marked offline. Short figures here (1 s each); the
 * defaults (5 s each) and what they give are measured by `npm run bench -- webrtc-health`.
 */
describe("a device that vanishes is noticed; one that answers is kept", () => {
  let server: TestServer;
  before(async () => {
    server = await startTestServer({ config: { webrtc: { liveness_quiet_ms: 1_000, liveness_probe_timeout_ms: 1_000 } } });
  });
  after(async () => {
    await server.stop();
  });

  test("a device whose network is gone (no close, no answer) is closed as unresponsive and marked offline", async () => {
    const relay = await UdpRelay.start();
    const device = await connect(server, { rtc: relay.rtc() });
    try {
      const held = await eventually(() => server.transport!.connection(device.publicKey)?.active && server.transport!.connection(device.publicKey));
      assert.equal((await server.domain.peers.runtime(device.publicKey)).online, true);
      relay.cut("both");
      await eventually(() => !held.active, 10_000, "the connection closed");
      assert.equal(held.closeReason, "unresponsive");
      await eventually(async () => !(await server.domain.peers.runtime(device.publicKey)).online, 5_000, "the peer offline");
    } finally {
      device.close();
      relay.close();
    }
  });

  test("a quiet device is asked all.ping and kept while it answers, even with an error (a device without the method)", async () => {
    let pings = 0;
    const answering = await connect(server, {
      handlers: {
        [RpcMethod.ALL_PING]: (payload, ctx) => {
          pings++;
          return commonHandlers()[RpcMethod.ALL_PING]!(payload, ctx);
        },
      },
    });
    let refusals = 0;
    const refusing = await connect(server, {
      handlers: {
        [RpcMethod.ALL_PING]: () => {
          refusals++;
          throw new RpcError(RpcCode.METHOD_NOT_FOUND, "no ping here");
        },
      },
    });
    try {
      const held = await Promise.all(
        [answering, refusing].map((d) => eventually(() => server.transport!.connection(d.publicKey)?.active && server.transport!.connection(d.publicKey))),
      );
      // wrtc sends RTCP reports every few seconds: quiet spells of 1 s come, and each is a probe.
      await eventually(() => pings >= 2 && refusals >= 2, 20_000, `probes answered (${pings} pings, ${refusals} refusals)`);
      assert.deepEqual(
        held.map((c) => c.active),
        [true, true],
      );
      assert.equal((await answering.http(1, "GET", "/me")).status, 200);
      assert.equal((await refusing.http(1, "GET", "/me")).status, 200);
    } finally {
      answering.close();
      refusing.close();
    }
  });
});

describe("the transport's timings are checked at start", () => {
  test("a staleness window not above twice the heartbeat, or an ownership check slower than it, refuses to start", async () => {
    const timings = {
      ownershipCheckMs: 2_000,
      runtimeRefreshMs: 5_000,
      gatherTimeoutMs: 5_000,
      livenessQuietMs: 5_000,
      livenessProbeTimeoutMs: 5_000,
      rpcRequestTimeoutMs: 10_000,
    };
    assert.doesNotThrow(() => checkTimings(timings));
    assert.throws(
      () => checkTimings(timings, { beatMs: 5_000, staleMs: 8_000 }),
      /staleness window \(8000 ms\) must exceed twice the node heartbeat interval \(5000 ms\)/,
    );
    await assert.rejects(
      startTestServer({ config: { webrtc: { ownership_check_ms: 9_000 } } }),
      /inconsistent WebRTC timings: webrtc.ownership_check_ms \(9000\)/,
    );
  });
});
