import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import wrtc from "@roamhq/wrtc";
import pino from "pino";
import { adapterListener } from "../src/http/listener.ts";
import { Metrics } from "../src/http/metrics.ts";
import type { ChannelPort } from "../src/protocol/channel.ts";
import type { StreamSocket } from "../src/protocol/stream-socket.ts";
import { Answerer, type PeerLink } from "../src/transport/answerer.ts";
import { StreamHttpServer } from "../src/transport/http-streams.ts";
import { freeUdpPort } from "./support/server.ts";
import { answeredBy, eventually } from "./support/webrtc.ts";

/**
 * The seam between DataChannel streams and Node's HTTP server with Hono's adapter
 * (`src/transport/http-streams.ts`): every member Node and `@hono/node-server` touch on a stream
 * is recorded, over real exchanges on a real WebRTC connection (a whole request, a partial body
 * answered early and drained by Hono, a request that times out, one that asked for keep-alive).
 * The test fails when an upgrade makes them use a member `StreamSocket` lacks, or stop using
 * one the seam was built for: the lists below are then to be read again, not just updated.
 */

/** Members Node sets on a socket itself, or looks for and copes without (read before they exist). */
const LOOKED_FOR_AND_ABSENT = new Set([
  "_handle", // no native handle: Node reads the stream through its events instead
  "_httpMessage", // Node's own, set on the socket while a response is in flight
  "_paused",
  "encrypted", // not TLS
  "parser",
  "server",
  "_server",
  "timeout",
  "_peername",
  "_host",
  "_pendingData",
  "_pendingEncoding",
  "_hadError", // net.Socket's flag for a close after an error; undefined reads as false
]);

/** What the seam exists for: Hono's drain timer calls `destroySoon`; Node reads, writes and closes the socket and logs its address. */
const MUST_BE_USED = ["destroySoon", "on", "write", "end", "destroy", "remoteAddress"];

/** A proxy of `socket` recording the names read on it, and which of them were absent then. */
function recording(socket: StreamSocket, used: Set<string>, absent: Set<string>): StreamSocket {
  return new Proxy(socket, {
    get(target, name, receiver) {
      if (typeof name === "string") {
        used.add(name);
        if (!(name in target)) absent.add(name);
      }
      const value = Reflect.get(target, name, receiver);
      return value;
    },
  });
}

describe("the seam Node's HTTP server and Hono's adapter rely on", () => {
  let answerer: Answerer;
  let pc: RTCPeerConnection;
  let link: PeerLink;
  const ports: ChannelPort[] = [];
  before(async () => {
    answerer = new Answerer({ udpPort: await freeUdpPort(), bindAddress: "127.0.0.1", publicAddress: undefined, gatherTimeoutMs: 5_000 });
    pc = new (wrtc as unknown as { RTCPeerConnection: typeof RTCPeerConnection }).RTCPeerConnection({ iceServers: [] });
    pc.addTransceiver("audio", { direction: "sendrecv" });
    pc.createDataChannel("giznet/v1/service/32");
    link = await answeredBy(answerer, pc, (l) => l.onChannel((port) => ports.push(port)));
  });
  after(() => {
    pc.close();
    link.close();
  });

  test("every member touched exists on StreamSocket, or is one Node sets or copes without", async () => {
    const used = new Set<string>();
    const absent = new Set<string>();
    const server = new StreamHttpServer(
      adapterListener(async (request) => {
        // An early answer to a body never read (Hono drains it, then calls destroySoon); a whole one otherwise.
        if (request.method === "POST") return new Response("early", { status: 413 });
        if (request.method === "PUT") await request.text();
        return new Response("ok");
      }),
      { requestTimeoutMs: 400, logger: pino({ level: "silent" }), metrics: new Metrics(async () => 0) },
    );
    const exchanges = [
      "GET / HTTP/1.1\r\nHost: perch\r\nConnection: close\r\n\r\n",
      "POST / HTTP/1.1\r\nHost: perch\r\nContent-Length: 100000\r\n\r\n{",
      "PUT / HTTP/1.1\r\nHost: perch\r\nContent-Length: 100\r\n\r\n{",
      "GET / HTTP/1.1\r\nHost: perch\r\n\r\n",
    ];
    const answers: string[] = [];
    for (const [i, request] of exchanges.entries()) {
      const dc = pc.createDataChannel(`seam-${i}`);
      dc.binaryType = "arraybuffer";
      let raw = "";
      dc.onmessage = (e) => {
        raw += Buffer.from(e.data as ArrayBuffer).toString();
      };
      await eventually(() => dc.readyState === "open", 5_000, "the channel open");
      const port = await eventually(() => ports.find((p) => p.label === `seam-${i}`));
      const socket = StreamHttpServer.socket(port, "192.0.2.7:4000");
      server.serve(recording(socket, used, absent), { peerKey: "seam", remoteAddress: "192.0.2.7" });
      dc.send(request);
      // Past Hono's drain wait (500 ms) and the request timeout: the stream is closed by the server.
      await eventually(() => socket.destroyed, 5_000, `exchange ${i} closed by the server`);
      // The answer's bytes arrive before the channel's close (one ordered stream): read once closed.
      await eventually(() => dc.readyState === "closed", 5_000, `exchange ${i}'s channel closed at the device`);
      answers.push(raw.split("\r\n")[0] ?? "");
    }
    server.close();
    assert.deepEqual(answers, ["HTTP/1.1 200 OK", "HTTP/1.1 413 Payload Too Large", "HTTP/1.1 408 Request Timeout", "HTTP/1.1 200 OK"]);
    const unexpected = [...absent].filter((name) => !LOOKED_FOR_AND_ABSENT.has(name));
    assert.deepEqual(unexpected, [], `Node or Hono now use members StreamSocket lacks: ${unexpected.join(", ")}`);
    const unused = MUST_BE_USED.filter((name) => !used.has(name));
    assert.deepEqual(unused, [], `Node or Hono no longer use: ${unused.join(", ")} (is the seam still needed as it is?)`);
  });
});
