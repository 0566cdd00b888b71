/**
 * A plain chat request (text messages, a few settings) skips the schema: for every request here,
 * plain, at the edges of plain, or beyond it, parseChatRequest must decide as the schema's path
 * (checkChatRequest) does and give the same data.
 */
import assert from "node:assert/strict";
import { describe, test } from "node:test";
import { checkChatRequest, parseChatRequest } from "../src/protocol/compat.ts";

const user = { role: "user", content: "hi" };
const base = { model: "m", messages: [user] };
const req = (extra: Record<string, unknown>) => ({ ...base, ...extra });
const msg = (m: Record<string, unknown>) => ({ ...base, messages: [m] });

/** Requests the hand check takes (the schema accepts them too). */
const plain: unknown[] = [
  base,
  req({ stream: true }),
  req({ stream: false }),
  req({ stream: null, temperature: null, top_p: null, max_tokens: null, max_completion_tokens: null, user: null }),
  req({ temperature: 0, top_p: 0 }),
  req({ temperature: 2, top_p: 1 }),
  req({ max_tokens: 1 }),
  req({ max_completion_tokens: 4096 }),
  req({ max_tokens: 5, max_completion_tokens: null }),
  req({ user: "" }),
  req({ user: "u".repeat(256) }),
  {
    model: "m",
    messages: [
      { role: "system", content: "s", name: "n" },
      { role: "developer", content: "" },
      { role: "user", content: "u", name: "x".repeat(256) },
      { role: "assistant", content: "" },
    ],
  },
];

/** Requests the hand check leaves to the schema: refused, or beyond the plain shape. */
const notPlain: unknown[] = [
  null,
  [],
  "text",
  {},
  req({ model: "" }),
  req({ model: 5 }),
  { model: "m" },
  req({ messages: [] }),
  req({ messages: {} }),
  req({ messages: [null] }),
  req({ messages: [[user]] }),
  req({ messages: Array.from({ length: 4097 }, () => user) }),
  msg({ role: "tool", content: "t", tool_call_id: "c" }),
  msg({ role: "tool", content: "t" }),
  msg({ role: "robot", content: "t" }),
  msg({ role: "user" }),
  msg({ role: "user", content: null }),
  msg({ role: "assistant", content: null }),
  msg({ role: "user", content: 5 }),
  msg({ role: "user", content: [{ type: "text", text: "parts" }] }),
  msg({ role: "user", content: "c", name: "" }),
  msg({ role: "user", content: "c", name: null }),
  msg({ role: "user", content: "c", name: "x".repeat(257) }),
  msg({ role: "user", content: "c", extra: 1 }),
  msg({ content: "c" }),
  req({ stream: "yes" }),
  req({ stream: 1 }),
  req({ temperature: 2.0001 }),
  req({ temperature: -0.1 }),
  req({ temperature: "1" }),
  req({ temperature: Number.POSITIVE_INFINITY }),
  req({ top_p: 1.1 }),
  req({ max_tokens: 0 }),
  req({ max_tokens: 1.5 }),
  req({ max_tokens: 2 ** 53 }),
  req({ max_tokens: "5" }),
  req({ max_tokens: 5, max_completion_tokens: 5 }),
  req({ user: "u".repeat(257) }),
  req({ user: 5 }),
  req({ extra: true }),
  req({ stream: true, stream_options: { include_usage: true } }),
  req({ stop: "\n" }),
  req({ seed: 7 }),
  req({ n: 1 }),
  JSON.parse('{"model":"m","messages":[{"role":"user","content":"hi"}],"__proto__":{"x":1}}'),
  JSON.parse('{"model":"m","messages":[{"role":"user","content":"hi","__proto__":{"x":1}}]}'),
];

describe("plain chat requests", () => {
  test("each is decided as the schema decides it, with the same data", () => {
    for (const value of [...plain, ...notPlain]) {
      const ours = parseChatRequest(structuredClone(value));
      const schema = checkChatRequest(structuredClone(value));
      const what = JSON.stringify(value)?.slice(0, 120);
      assert.equal(ours.success, schema.success, what);
      if (schema.success) assert.deepEqual(ours.data, schema.data, what);
    }
  });

  test("the plain ones skip the schema (taken as they are), the others do not", () => {
    for (const value of plain) assert.equal(parseChatRequest(value).data, value, JSON.stringify(value));
    for (const value of notPlain) {
      const r = parseChatRequest(value);
      assert.ok(!r.success || r.data !== value, JSON.stringify(value)?.slice(0, 120));
    }
  });
});
