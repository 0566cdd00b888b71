import type { ChatChunk, FinishReason, Usage } from "../protocol/compat.ts";
import type { ChatEvent } from "./chat-stream.ts";

/**
 * The chunks of one streamed completion that Perch writes itself (an agent's run, an AI SDK
 * provider's stream): one id, time and model throughout; the first delta carries the role, and
 * with `include_usage` every chunk has `usage: null` until the last one carries it.
 */
export class ChunkWriter {
  private readonly id = `chatcmpl-${crypto.randomUUID().replaceAll("-", "")}`;
  private readonly created = Math.floor(Date.now() / 1000);
  private started = false;
  private readonly model: string;
  private readonly includeUsage: boolean;

  constructor(model: string, includeUsage: boolean) {
    this.model = model;
    this.includeUsage = includeUsage;
  }

  delta(delta: ChatChunk["choices"][number]["delta"], finish: FinishReason | null = null): ChatEvent {
    if (!this.started) {
      this.started = true;
      delta = { role: "assistant", ...delta };
    }
    const c: ChatChunk = {
      id: this.id,
      object: "chat.completion.chunk",
      created: this.created,
      model: this.model,
      choices: [{ index: 0, delta, finish_reason: finish }],
    };
    if (this.includeUsage) c.usage = null;
    return { type: "chunk", chunk: c };
  }

  /** The final delta with `reason`, then (with `include_usage`) the usage chunk. */
  last(reason: FinishReason | null, usage: Usage): ChatEvent[] {
    const last = this.delta({}, reason);
    if (!this.includeUsage) return [last];
    const chunk: ChatChunk = { id: this.id, object: "chat.completion.chunk", created: this.created, model: this.model, choices: [], usage };
    return [last, { type: "chunk", chunk }];
  }

  /** `last`, then the end of the stream. */
  finish(reason: FinishReason, usage: Usage): ChatEvent[] {
    return [...this.last(reason, usage), { type: "done" }];
  }
}
