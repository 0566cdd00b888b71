import assert from "node:assert/strict";
import { test } from "node:test";
import { normaliseTranscript } from "../src/ai/speech/normalise.ts";

test("transcripts as OpenAI's models write them: digits, today, a closing stop", () => {
  assert.equal(normaliseTranscript("what is the weather like to-day"), "What is the weather like today.");
  assert.equal(normaliseTranscript("Call my mother to-morrow morning, or To-night?"), "Call my mother tomorrow morning, or Tonight?");
  assert.equal(normaliseTranscript("set a timer for ten minutes"), "Set a timer for 10 minutes.");
  assert.equal(normaliseTranscript("  "), "");
  assert.equal(normaliseTranscript("a toe-day walk"), "A toe-day walk.");
});
