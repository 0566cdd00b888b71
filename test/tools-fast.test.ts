import assert from "node:assert/strict";
import { describe, test } from "node:test";
import { toolMessageText } from "../src/ai/agents/toolbox.ts";
import { acceptTools, type OfferedTool } from "../src/mcp/bounds.ts";
import { fromCallResult } from "../src/mcp/results.ts";
import type { VoiceEvents } from "../src/voice/peer-events.ts";
import { toolEvents } from "../src/voice/tool-events.ts";

/** In process, no network: what the tool results and the voice events carry. */
describe("tools, fast", () => {
  test("tool.call and tool.result events: arguments as JSON (or their text), the result's text cut at 4 KiB on a character boundary", () => {
    const sent: Array<[string, string, string]> = [];
    const events = { done: (stream: string, label: string, text: string) => sent.push([stream, label, text]) } as unknown as VoiceEvents;
    const observer = toolEvents(events, "out-7");
    observer.called("device.set_volume", '{"level":3}');
    observer.called("device.x", "not json");
    observer.finished("device.set_volume", { text: "é".repeat(3000), isError: false, images: [], result: "ok" });
    assert.deepEqual(sent[0], ["out-7", "tool.call", '{"name":"device.set_volume","arguments":{"level":3}}']);
    assert.deepEqual(JSON.parse(sent[1]![2]), { name: "device.x", arguments: "not json" });
    const result = JSON.parse(sent[2]![2]) as { text: string; is_error: boolean };
    assert.equal(sent[2]![1], "tool.result");
    assert.equal(result.is_error, false);
    assert.equal(Buffer.byteLength(result.text), 4096);
    assert.equal(result.text, "é".repeat(2048));
  });

  test("call results: text joined, images kept aside, other items named, isError a failed call; images a model cannot take are noted", () => {
    const r = fromCallResult({
      content: [
        { type: "text", text: "one" },
        { type: "image", data: "AAAA", mimeType: "image/png" },
        { type: "audio", data: "BBBB", mimeType: "audio/wav" },
        { type: "text", text: "two" },
      ],
    });
    assert.equal(r.text, "one\n[audio content omitted]\ntwo");
    assert.deepEqual(r.images, [{ mimeType: "image/png", data: "AAAA" }]);
    assert.equal(toolMessageText(r, true), "one\n[audio content omitted]\ntwo");
    assert.match(toolMessageText(r, false), /\[1 image\(s\) omitted: this model does not take images\]$/);
    const failed = fromCallResult({ content: [{ type: "text", text: "no such room" }], isError: true });
    assert.equal(failed.result, "error");
    assert.equal(toolMessageText(failed, false), '{"error":"no such room"}');
    assert.equal(fromCallResult("garbage").text, "");
  });

  test("bounds: 128 tools at most, and across pages", () => {
    const into: OfferedTool[] = [];
    const page = (from: number, n: number) => Array.from({ length: n }, (_, i) => ({ name: `t${from + i}`, inputSchema: { type: "object" } }));
    assert.deepEqual(acceptTools(page(0, 100), into), []);
    assert.deepEqual(acceptTools(page(100, 100), into), ["more than 128 tools"]);
    assert.equal(into.length, 128);
    assert.equal(into.at(-1)!.name, "t127");
    assert.deepEqual(acceptTools({}, into), ["tools is not an array"]);
  });
});
