import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import { create, toBinary } from "@bufbuild/protobuf";
import { generateKeyPair } from "../src/crypto/keys.ts";
import { encodeFrame, FrameType } from "../src/protocol/frames.ts";
import {
  ClientGetIdentifiersResponseSchema,
  ClientGetInfoResponseSchema,
  EmptySchema,
  RpcMethod,
  ServerPutInfoRequestSchema,
  ServerPutInfoResponseSchema,
} from "../src/protocol/gen/rpc_pb.ts";
import { RpcCode, RpcError, rpcPayload } from "../src/protocol/rpc.ts";
import { PerchClient } from "../src/sdk/client.ts";
import type { PerchConnection } from "../src/sdk/webrtc.ts";
import { startTestServer, type TestServer } from "./support/server.ts";
import { connect, eventually } from "./support/webrtc.ts";

const empty = toBinary(EmptySchema, create(EmptySchema));

/** A Side Control client for the device behind `conn` (over TCP, as a companion app would be). */
async function sideControl(server: TestServer, conn: PerchConnection): Promise<PerchClient> {
  const device = new PerchClient({ baseUrl: server.url, keyPair: conn.keyPair });
  await device.login();
  const token = await device.createDeviceToken();
  const phone = server.client();
  await phone.login({ deviceToken: token.token });
  return phone;
}

describe("WebRTC transport with the device SDK (node-datachannel)", () => {
  let server: TestServer;
  before(async () => {
    server = await startTestServer();
  });
  after(async () => {
    await server.stop();
  });

  test("/server-info advertises UDP ICE once the node answers offers", async () => {
    const info = await server.client().serverInfo();
    assert.deepEqual(info.ice, { udp: true, tcp: false });
  });

  test("HTTP over stream 1: /me, status read and write, a 204; the caller is the connection's key", async () => {
    const conn = await connect(server);
    try {
      assert.match(conn.timings.serverTiming, /verify;dur=[\d.]+, answer;dur=[\d.]+, seal;dur=[\d.]+, total;dur=[\d.]+/);
      const me = await conn.http(1, "GET", "/me");
      assert.equal(me.status, 200);
      assert.equal(me.json<{ public_key: string }>().public_key, conn.publicKey);
      assert.equal(me.headers.connection, "close");
      assert.deepEqual((await conn.http(1, "GET", "/me/status")).json(), {});
      const put = await conn.http(1, "PUT", "/me/status", {
        body: JSON.stringify({ volume: 40, muted: false }),
        headers: { "content-type": "application/json" },
      });
      assert.equal(put.status, 200, put.body.toString());
      assert.equal((await conn.http(1, "GET", "/me/status")).json<{ volume: number }>().volume, 40);
      const token = (await conn.http(1, "POST", "/me/side-control/device-tokens")).json<{ id: string }>();
      const deleted = await conn.http(1, "DELETE", `/me/side-control/device-tokens/${token.id}`);
      assert.equal(deleted.status, 204);
      assert.equal(deleted.body.length, 0);
      const bad = await conn.http(1, "PUT", "/me/status", { body: "{", headers: { "content-type": "application/json" } });
      assert.equal(bad.status, 400);
      const runtime = (await conn.http(1, "GET", "/me/runtime")).json<{ online: boolean; node: string }>();
      assert.equal(runtime.online, true);
      // The selected pair is written at activation, or with the next refresh when not known yet.
      await eventually(
        async () => /^\d+\.\d+\.\d+\.\d+:\d+$/.test((await conn.http(1, "GET", "/me/runtime")).json<{ last_addr?: string }>().last_addr ?? ""),
        12_000,
      );
      // A Side Control route is not for a device's own connection.
      assert.equal((await conn.http(1, "GET", "/side-control/info")).status, 403);
      // Stream 2 is the Compatible API at /v1, the connection's key the caller (no header).
      const models = await conn.http(2, "GET", "/v1/models");
      assert.equal(models.status, 200);
      const list = models.json<{ object: string; data: Array<{ id: string }> }>();
      assert.equal(list.object, "list");
      assert.ok(
        list.data.some((m) => m.id === "tts-1"),
        JSON.stringify(list),
      );
      const missing = await conn.http(2, "GET", "/v1/nowhere");
      assert.equal(missing.status, 404);
      assert.deepEqual(Object.keys(missing.json<{ error: object }>().error).sort(), ["code", "message", "param", "type"]);
    } finally {
      conn.close();
    }
  });

  test("uploads past the channel's high-water mark complete, though wrtc never fires bufferedamountlow", async () => {
    const conn = await connect(server);
    try {
      // Without a drain the device's writer waited until the server gave up on the request (10 s
      // without the rest of it) and the speed test failed.
      const speed = await conn.speedTest(0, 8 * 1024 * 1024);
      assert.equal(speed.up, 8 * 1024 * 1024);
    } finally {
      conn.close();
    }
  });

  test("Peer RPC both ways: ping, speed test, −32601 for unknown methods, server.info.put", async () => {
    const conn = await connect(server);
    try {
      const ping = await conn.ping();
      assert.ok(Math.abs(ping.serverTime - Date.now()) < 5000);
      const speed = await conn.speedTest(300_000, 200_000);
      assert.deepEqual([speed.down, speed.up], [300_000, 200_000]);
      await assert.rejects(conn.call(RpcMethod.CLIENT_INFO_GET, empty), (e: unknown) => e instanceof RpcError && e.code === RpcCode.METHOD_NOT_FOUND);
      await assert.rejects(conn.call(99 as RpcMethod, empty), (e: unknown) => e instanceof RpcError && e.code === RpcCode.METHOD_NOT_FOUND);
      const put = await conn.call(
        RpcMethod.SERVER_INFO_PUT,
        toBinary(ServerPutInfoRequestSchema, create(ServerPutInfoRequestSchema, { value: { name: "kitchen", emoji: "🐦" } })),
      );
      const { fromBinary } = await import("@bufbuild/protobuf");
      assert.equal(fromBinary(ServerPutInfoResponseSchema, put.payload).value?.name, "kitchen");
      await assert.rejects(
        conn.call(RpcMethod.SERVER_INFO_PUT, toBinary(ServerPutInfoRequestSchema, create(ServerPutInfoRequestSchema, { value: { name: "x".repeat(257) } }))),
        (e: unknown) => e instanceof RpcError && e.code === RpcCode.INVALID_PARAMS,
      );
      assert.deepEqual((await conn.http(1, "GET", "/me")).json<{ device: object }>().device, { name: "kitchen", emoji: "🐦" });

      const held = server.transport!.connection(conn.publicKey)!;
      const { payload } = await held.call(RpcMethod.ALL_PING, rpcPayload.ping());
      assert.ok(rpcPayload.pingResponse(payload).serverTime > 0n);
      const down = await held.call(RpcMethod.ALL_SPEED_TEST_RUN, rpcPayload.speedTest(100_000, 50_000), { upBytes: 50_000 });
      assert.equal(down.dataBytes, 100_000);
      assert.equal(rpcPayload.speedTestResponse(down.payload).upContentLength, 50_000n);

      // A malformed frame closes only its stream.
      const stream = await conn.openStream(0);
      stream.write(encodeFrame(FrameType.END).subarray(0, 2));
      stream.write(Buffer.from([9, 0])); // frame type 9 does not exist
      await new Promise((resolve) => stream.once("close", resolve));
      assert.equal((await conn.http(1, "GET", "/me")).status, 200);
    } finally {
      conn.close();
    }
  });

  test("device info is pulled from a device that provides client.*, and nothing changes for one that answers −32601", async () => {
    const provider = await connect(server, {
      handlers: {
        [RpcMethod.CLIENT_INFO_GET]: () => ({
          payload: toBinary(
            ClientGetInfoResponseSchema,
            create(ClientGetInfoResponseSchema, { value: { manufacturer: "Acme", model: "Perchy", hardwareRevision: "r2" } }),
          ),
        }),
        [RpcMethod.CLIENT_IDENTIFIERS_GET]: () => ({
          payload: toBinary(
            ClientGetIdentifiersResponseSchema,
            create(ClientGetIdentifiersResponseSchema, {
              value: { sn: "SN1", imeis: [{ tac: "35", serial: "123" }], labels: [{ key: "color", value: "red" }] },
            }),
          ),
        }),
      },
    });
    const plain = await connect(server);
    try {
      const device = await eventually(async () => {
        const d = (await provider.http(1, "GET", "/me")).json<{ device: Record<string, unknown> }>().device;
        return d.identifiers ? d : undefined;
      });
      assert.deepEqual(device, {
        hardware: { hardware_revision: "r2", manufacturer: "Acme", model: "Perchy" },
        identifiers: { sn: "SN1", imeis: [{ tac: "35", serial: "123" }], labels: [{ key: "color", value: "red" }] },
      });
      const phone = await sideControl(server, provider);
      assert.deepEqual(await phone.sideControl.info(), device);
      // Read after the provider's info is visible to its phone: nothing can reach the other device later.
      assert.deepEqual((await plain.http(1, "GET", "/me")).json<{ device: object }>().device, {});
    } finally {
      provider.close();
      plain.close();
    }
  });

  test("telemetry packets reach /side-control/telemetry/latest and merge into status; invalid frames are counted", async () => {
    const conn = await connect(server);
    try {
      const now = Date.now();
      conn.sendTelemetry({
        observedAtUnixMs: BigInt(now),
        observations: [
          { observedAtDeltaMs: 0, body: { case: "battery", value: { percent: 77, charging: true, voltageMv: 3900 } } },
          { observedAtDeltaMs: -10, body: { case: "gnss", value: { latitude: 48.1, longitude: 11.5, accuracyM: 4 } } },
          { observedAtDeltaMs: 0, body: { case: "network", value: { rssiDbm: -60, connected: true } } },
        ],
      });
      conn.sendTelemetry({ observedAtUnixMs: BigInt(now), observations: [{ observedAtDeltaMs: 0, body: { case: "battery", value: { percent: 140 } } }] });
      conn.sendTelemetry({
        observedAtUnixMs: BigInt(now + 2 * 86_400_000),
        observations: [{ observedAtDeltaMs: 0, body: { case: "battery", value: { percent: 1 } } }],
      });
      const phone = await sideControl(server, conn);
      const latest = await eventually(async () => {
        const l = await phone.sideControl.telemetryLatest();
        return l.values.length >= 7 ? l : undefined;
      });
      const byField = Object.fromEntries(latest.values.map((v) => [v.field, v.value]));
      assert.equal(byField["battery.percent"], 77);
      assert.equal(byField["battery.charging"], 1);
      assert.equal(byField["gnss.latitude"], 48.1);
      assert.equal(byField["network.connected"], 1);
      const status = await phone.sideControl.status();
      assert.equal(status.battery_percent, 77);
      assert.equal(status.charging, true);
      assert.equal(status.gnss_longitude, 11.5);
      const metrics = await (await fetch(`${server.url}/metrics`)).text();
      assert.match(metrics, /perch_telemetry_frames_dropped_total\{reason="out_of_range"\} [1-9]/);
      assert.match(metrics, /perch_telemetry_frames_dropped_total\{reason="future"\} [1-9]/);
    } finally {
      conn.close();
    }
  });

  test("runtime: online while connected, written offline by its node on a close; a second connection of the same key replaces the first", async () => {
    const keyPair = generateKeyPair();
    const first = await connect(server, { keyPair });
    const phone = await sideControl(server, first);
    assert.equal((await phone.sideControl.runtime()).online, true);
    const second = await connect(server, { keyPair });
    await first.closed();
    assert.equal((await second.http(1, "GET", "/me/runtime")).json<{ online: boolean }>().online, true);
    assert.equal((await phone.sideControl.runtime()).online, true);
    second.close();
    const runtime = await eventually(async () => {
      const r = await phone.sideControl.runtime();
      return r.online ? undefined : r;
    }, 10_000);
    // Offline because the node wrote it so on the close (not because its heartbeat went stale: it beats on).
    const record = await server.store.read((r) => r.runtime.get(first.publicKey));
    assert.equal(record?.online, 0, "recorded offline by the node that held the connection");
    assert.ok(runtime.last_seen_at);
    assert.equal(server.transport!.size, 0);
  });

  test("the server's audio reaches the device: a tone asked for over stream 1 decodes as non-silent audio", async () => {
    const conn = await connect(server);
    try {
      const res = await conn.http(1, "POST", "/me/audio/tone", {
        body: JSON.stringify({ frequency_hz: 440, duration_ms: 600 }),
        headers: { "content-type": "application/json" },
      });
      assert.equal(res.status, 202, res.body.toString());
      await eventually(() => conn.audio.audible > 10, 5000, "audible audio");
      const tcp = new PerchClient({ baseUrl: server.url, keyPair: generateKeyPair() });
      await tcp.login();
      await assert.rejects(tcp.request("POST", "/me/audio/tone"), /409 NOT_CONNECTED/);
    } finally {
      conn.close();
    }
  });
});
