import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import wrtc from "@roamhq/wrtc";
import type { ChannelPort } from "../src/protocol/channel.ts";
import { StreamSocket } from "../src/protocol/stream-socket.ts";
import { Answerer, type PeerLink } from "../src/transport/answerer.ts";
import { watchCrashes } from "./support/crashes.ts";
import { freeUdpPort } from "./support/server.ts";
import { answeredBy, eventually } from "./support/webrtc.ts";

/**
 * Every callback the WebRTC library (node-datachannel) makes into the transport, and the timers
 * and stream events behind them, run outside any request: a throw there used to end the process.
 * Here each one is made to throw, over a real connection (a `@roamhq/wrtc` device and the
 * server's own `Answerer`), and only what it belonged to is closed.
 */

interface Device {
  pc: RTCPeerConnection;
  link: PeerLink;
  faults: Array<{ err: unknown; scope: string }>;
  /** Sends 10 ms of audio (RTP) from the device. */
  speak(): void;
}

/** A wrtc device answered by a real `Answerer`; `setup` registers the link's callbacks before the connection is made. */
async function device(answerer: Answerer, setup: (link: PeerLink) => void): Promise<Device> {
  const rtc = wrtc as unknown as {
    RTCPeerConnection: typeof RTCPeerConnection;
    nonstandard: { RTCAudioSource: new () => { createTrack(): MediaStreamTrack; onData(d: object): void } };
  };
  const pc = new rtc.RTCPeerConnection({ iceServers: [] });
  const source = new rtc.nonstandard.RTCAudioSource();
  pc.addTransceiver(source.createTrack(), { direction: "sendrecv" });
  pc.createDataChannel("giznet/v1/service/32");
  const faults: Device["faults"] = [];
  const link = await answeredBy(answerer, pc, (l) => {
    l.onFault((err, scope) => faults.push({ err, scope }));
    setup(l);
  });
  const samples = new Int16Array(480).map((_, i) => Math.round(Math.sin(i / 5) * 8000));
  return { pc, link, faults, speak: () => source.onData({ samples, sampleRate: 48_000, bitsPerSample: 16, channelCount: 1, numberOfFrames: 480 }) };
}

/** Opens a channel on the device and resolves with it once open (or closed). */
function channel(pc: RTCPeerConnection, label: string): Promise<RTCDataChannel> {
  const dc = pc.createDataChannel(label);
  return eventually(() => dc.readyState !== "connecting" && dc, 5_000, `${label} open or closed`);
}

function closed(dc: RTCDataChannel): Promise<void> {
  return eventually(() => dc.readyState === "closed", 5_000, `${dc.label} closed`).then(() => undefined);
}

describe("a callback that throws closes only what it belongs to", () => {
  let answerer: Answerer;
  before(async () => {
    answerer = new Answerer({ udpPort: await freeUdpPort(), bindAddress: "127.0.0.1", publicAddress: undefined, gatherTimeoutMs: 5_000 });
  });
  const devices: Device[] = [];
  after(() => {
    for (const d of devices) {
      d.pc.close();
      d.link.close();
    }
  });

  test("a new channel's handler, a message's reader and a channel's close: that channel is closed, the link serves on", async () => {
    const crashes = watchCrashes();
    const received: string[] = [];
    const failed: string[] = [];
    try {
      const d = await device(answerer, (link) =>
        link.onChannel((port: ChannelPort) => {
          if (port.label === "throw-on-open") throw new Error("handler failed");
          port.attach({
            message: (data) => {
              const text = Buffer.from(data).toString();
              if (port.label === "throw-on-message") throw new Error("reader failed");
              received.push(`${port.label}:${text}`);
              port.send(data);
            },
            closed: () => {
              if (port.label === "throw-on-close") throw new Error("close handler failed");
            },
            drained: () => {},
            failed: (err) => failed.push(`${port.label}:${err.message}`),
          });
        }),
      );
      devices.push(d);
      const refused = await channel(d.pc, "throw-on-open");

      await closed(refused);
      const reader = await channel(d.pc, "throw-on-message");
      assert.equal(reader.readyState, "open");
      reader.send("hello");
      await closed(reader);
      assert.deepEqual(failed, ["throw-on-message:reader failed"]);
      const closer = await channel(d.pc, "throw-on-close");
      closer.close();

      await eventually(() => failed.includes("throw-on-close:close handler failed"), 5_000, "the close handler's failure reported");
      // The link is untouched: a new channel works both ways.
      const echo = await channel(d.pc, "echo");
      const back = new Promise<string>((resolve) => {
        echo.onmessage = (e) => resolve(Buffer.from(e.data as ArrayBuffer).toString());
      });
      echo.binaryType = "arraybuffer";
      echo.send("still here");
      assert.equal(await back, "still here");
      assert.deepEqual(received, ["echo:still here"]);
      assert.deepEqual(
        d.faults.map((f) => [f.scope, (f.err as Error).message]),
        [
          ["channel", "handler failed"],
          ["channel", "reader failed"],
          ["channel", "close handler failed"],
        ],
      );
      assert.deepEqual(crashes.errors, []);
    } finally {
      crashes.stop();
    }
  });

  test("the connection's state handler and the audio track's reader: each is reported as a fault of the link, to its owner (the connection, which closes)", async () => {
    const crashes = watchCrashes();
    try {
      const d = await device(answerer, (link) => {
        link.onState(() => {
          throw new Error("state handler failed");
        });
        link.onRtp(() => {
          throw new Error("audio reader failed");
        });
      });
      devices.push(d);
      await eventually(() => d.faults.some((f) => (f.err as Error).message === "state handler failed"), 10_000, "the state handler's failure");
      for (let i = 0; i < 50 && !d.faults.some((f) => (f.err as Error).message === "audio reader failed"); i++) {
        d.speak();
        await new Promise((r) => setTimeout(r, 10));
      }
      assert.deepEqual([...new Set(d.faults.map((f) => `${f.scope}: ${(f.err as Error).message}`))].sort(), [
        "link: audio reader failed",
        "link: state handler failed",
      ]);
      assert.deepEqual(crashes.errors, []);
    } finally {
      crashes.stop();
    }
  });

  test("a stream's idle-timeout listener (a timer) that throws destroys that stream", async () => {
    const crashes = watchCrashes();
    try {
      const ports: ChannelPort[] = [];
      const d = await device(answerer, (link) => link.onChannel((port) => ports.push(port)));
      devices.push(d);
      const dc = await channel(d.pc, "idle");
      const port = await eventually(() => ports.find((p) => p.label === "idle"));
      const socket = new StreamSocket(port);
      const errors: Error[] = [];
      socket.on("error", (err) => errors.push(err));
      socket.setTimeout(20, () => {
        throw new Error("timeout listener failed");
      });
      await eventually(() => socket.destroyed, 5_000, "the stream destroyed");
      assert.deepEqual(
        errors.map((e) => e.message),
        ["timeout listener failed"],
      );
      await closed(dc);
      assert.deepEqual(crashes.errors, []);
    } finally {
      crashes.stop();
    }
  });
});
