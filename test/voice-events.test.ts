/**
 * The voice events as frames (transport contract §7: one event, one frame of at most 65,535
 * bytes): a model's very long text still goes out whole in deltas, and its TEXT_DONE fits.
 */
import assert from "node:assert/strict";
import { test } from "node:test";
import { fromBinary } from "@bufbuild/protobuf";
import { encodeFrame, FrameType, MAX_FRAME_PAYLOAD } from "../src/protocol/frames.ts";
import { type PeerEvent, PeerEventSchema } from "../src/protocol/gen/event_pb.ts";
import { encodeVoiceEvent, MAX_EVENT_TEXT_BYTES, VoiceEvents } from "../src/voice/peer-events.ts";
import type { AudioPort } from "../src/voice/port.ts";

/** The transport's side of the port: each event encoded as its one frame, as the connection does. */
function framedPort(): { port: AudioPort; events: PeerEvent[] } {
  const events: PeerEvent[] = [];
  let sequence = 0n;
  const port: AudioPort = {
    publicKey: "test",
    payloadType: 111,
    onPacket: () => () => {},
    sendFrame: () => true,
    sendEvent: (event) => {
      const bytes = encodeVoiceEvent(event, ++sequence, 0n);
      encodeFrame(FrameType.BINARY, bytes); // throws past MAX_FRAME_PAYLOAD, as the connection's would
      events.push(fromBinary(PeerEventSchema, bytes));
      return true;
    },
  };
  return { port, events };
}

test("a 200 KB reply (multi-byte characters) goes out whole in deltas that each fit a frame; TEXT_DONE carries its first part", () => {
  const { port, events } = framedPort();
  const voice = new VoiceEvents(port);
  const reply = "Grüße aus dem Café — ✓ ".repeat(8_000);
  assert.ok(Buffer.byteLength(reply) > 3 * MAX_FRAME_PAYLOAD);
  voice.delta("out-1", "assistant.text", reply);
  voice.done("out-1", "assistant.text", reply);
  const deltas = events.filter((e) => e.payload.case === "textDelta").map((e) => (e.payload.value as { text: string }).text);
  assert.ok(deltas.length >= 4);
  assert.equal(deltas.join(""), reply, "nothing lost or cut inside a character");
  for (const d of deltas) assert.ok(Buffer.byteLength(d) <= MAX_EVENT_TEXT_BYTES);
  const done = events.at(-1)!;
  assert.equal(done.payload.case, "textDone");
  const text = (done.payload.value as { text: string }).text;
  assert.ok(reply.startsWith(text) && Buffer.byteLength(text) <= MAX_EVENT_TEXT_BYTES && text.length > 0);
  assert.deepEqual(
    events.map((e) => (e.payload.value as { sequence: bigint }).sequence),
    events.map((_, i) => BigInt(i + 1)),
  );
});

test("short texts go out as they are", () => {
  const { port, events } = framedPort();
  const voice = new VoiceEvents(port);
  voice.delta("in-1", "user.transcript", "What is the weather like today?");
  voice.done("in-1", "user.transcript", "What is the weather like today?");
  assert.deepEqual(
    events.map((e) => (e.payload.value as { text: string }).text),
    ["What is the weather like today?", "What is the weather like today?"],
  );
});
