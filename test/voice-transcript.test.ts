/**
 * The transcript observer (src/voice/transcript.ts) in process: voice events as the conversation
 * sends them (built by the real `VoiceEvents`) become conversation entries. No sleeps: events are
 * handed over synchronously.
 */
import assert from "node:assert/strict";
import { describe, test } from "node:test";
import { encodeVoiceEvent, type VoiceEvent, VoiceEvents } from "../src/voice/peer-events.ts";
import type { AudioPort } from "../src/voice/port.ts";
import { observeTranscript, type TranscriptEntry } from "../src/voice/transcript.ts";

/** A device's port: `open` says whether its event stream is up; what it sent is counted. */
function devicePort(open = true): AudioPort & { sent: number } {
  let sequence = 0n;
  const port = {
    publicKey: "device",
    payloadType: 111,
    sent: 0,
    onPacket: () => () => {},
    sendFrame: () => true,
    sendEvent: (event: VoiceEvent) => {
      if (!open) return false;
      encodeVoiceEvent(event, ++sequence, BigInt(Date.now()));
      port.sent++;
      return true;
    },
  };
  return port;
}

function observed(open = true) {
  const entries: TranscriptEntry[] = [];
  const port = devicePort(open);
  const t = observeTranscript(port, (e) => entries.push(e));
  return { entries, events: new VoiceEvents(t.port), close: t.close, port };
}

const metrics = (interrupted: boolean) => JSON.stringify({ end_of_speech: 1, interrupted });

describe("the conversation's transcript, read from its voice events", () => {
  test("a turn: the user's final transcript, then the reply once the turn ends; partials and audio events are not entries", () => {
    const { entries, events, port } = observed();
    events.bos("in-1", "audio", "user.audio");
    events.delta("in-1", "user.transcript", "What is");
    events.eos("in-1", "audio", "user.audio");
    events.done("in-1", "user.transcript", "What is the time?");
    assert.deepEqual(entries, [{ turn: 1, role: "user", text: "What is the time?" }]);
    events.bos("out-1", "text", "assistant.text");
    events.delta("out-1", "assistant.text", "It is noon.");
    events.done("out-1", "assistant.text", "It is noon.");
    events.eos("out-1", "audio", "assistant.audio");
    assert.equal(entries.length, 1, "the reply waits for the turn's end");
    events.done("out-1", "turn.metrics", metrics(false));
    assert.deepEqual(entries[1], { turn: 1, role: "assistant", text: "It is noon." });
    assert.equal(port.sent, 9, "the device got every event");
  });

  test("a barge-in: the spoken part, interrupted, whether the turn's metrics or the audio's end says so", () => {
    const { entries, events } = observed();
    events.done("out-3", "assistant.text", "Once upon a");
    events.done("out-3", "turn.metrics", metrics(true));
    events.done("out-4", "assistant.text", "There was");
    events.eos("out-4", "audio", "assistant.audio", { code: "interrupted" });
    events.done("out-4", "turn.metrics", "not json");
    assert.deepEqual(entries, [
      { turn: 3, role: "assistant", text: "Once upon a", interrupted: true },
      { turn: 4, role: "assistant", text: "There was", interrupted: true },
    ]);
  });

  test("tool calls: one entry per result, with its name and whether it failed", () => {
    const { entries, events } = observed();
    events.done("out-2", "tool.call", JSON.stringify({ name: "device.set_volume", arguments: { level: 30 } }));
    events.done("out-2", "tool.result", JSON.stringify({ name: "device.set_volume", is_error: false, text: "volume 30" }));
    events.done("out-2", "tool.result", JSON.stringify({ name: "home.lights", is_error: true, text: "the hub is away" }));
    events.done("out-2", "tool.result", "{not json");
    events.done("out-2", "tool.result", JSON.stringify({ is_error: true }));
    assert.deepEqual(entries, [
      { turn: 2, role: "tool", text: "volume 30", tool: { name: "device.set_volume", is_error: false } },
      { turn: 2, role: "tool", text: "the hub is away", tool: { name: "home.lights", is_error: true } },
    ]);
  });

  test("nothing for an empty transcript, a failed turn, or stream ids that are not a turn's", () => {
    const { entries, events } = observed();
    events.done("in-1", "user.transcript", "   ");
    events.eos("out-1", "text", "assistant.text", { code: "failed", message: "model down" });
    events.done("out-1", "turn.metrics", metrics(false));
    events.done("in-x", "user.transcript", "hello");
    events.done("out-0", "assistant.text", "hello");
    events.done("out-0", "turn.metrics", metrics(false));
    assert.deepEqual(entries, []);
  });

  test("a reply still waiting when the connection ends goes as interrupted; a device without an event stream is heard all the same", () => {
    const { entries, events, close, port } = observed(false);
    events.done("in-1", "user.transcript", "Hello");
    events.done("out-1", "assistant.text", "Hi th");
    close();
    assert.equal(port.sent, 0);
    assert.deepEqual(entries, [
      { turn: 1, role: "user", text: "Hello" },
      { turn: 1, role: "assistant", text: "Hi th", interrupted: true },
    ]);
  });

  test("events stay objects until the transport encodes them: the device's port gets the very objects told, and the transcript reads them without decoding", () => {
    const told: VoiceEvent[] = [];
    const entries: TranscriptEntry[] = [];
    const t = observeTranscript(
      { publicKey: "device", payloadType: 111, onPacket: () => () => {}, sendFrame: () => true, sendEvent: (e) => told.push(e) > 0 },
      (e) => entries.push(e),
    );
    const event: VoiceEvent = { type: "done", streamId: "in-1", label: "user.transcript", text: "Hello" };
    assert.equal(t.port.sendEvent(event), true);
    assert.equal(told[0], event);
    assert.deepEqual(entries, [{ turn: 1, role: "user", text: "Hello" }]);
  });
});
