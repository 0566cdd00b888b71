import type { Logger } from "pino";
import { Counter, Histogram, type Registry } from "prom-client";
import type { ChatService } from "../ai/chat.ts";
import { fitMemory, rewriteMessages, type SaidLine } from "../ai/memory-prompt.ts";
import type { MemoryPolicy, MemoryService } from "../domain/memory.ts";
import type { ChatMessage, ChatRequest } from "../protocol/compat.ts";

/** A chat model's whole answer to `messages` (non-streaming); throws when the model fails. */
export type CompleteText = (deviceKey: string, model: string, messages: ChatMessage[], signal: AbortSignal) => Promise<string>;

/** `CompleteText` through the Compatible API's model code (the catalog's model, its fallbacks, retries and timeouts), the device as the caller. */
export async function completeText(chat: ChatService, deviceKey: string, model: string, messages: ChatMessage[], signal: AbortSignal): Promise<string> {
  const caller = { kind: "device" as const, publicKey: deviceKey };
  const result = await chat.run(chat.resolve(caller, model), caller, { model, messages, stream: false } as ChatRequest, signal);
  if (result.kind !== "completion") throw new Error("the model streamed");
  const content = result.completion.choices[0]?.message?.content;
  if (typeof content !== "string") throw new Error("the model answered no text");
  return content;
}

export type RewriteResult = "ok" | "failed" | "skipped";

/** One ended conversation whose memory is to be rewritten. */
export interface RewriteJob {
  deviceKey: string;
  /** The domain clock's time the conversation began: forgetting after it means it is not remembered. */
  startedAt: number;
  policy: MemoryPolicy;
  said: readonly SaidLine[];
}

export interface MemoryRewriterOptions {
  memory: MemoryService;
  complete: CompleteText;
  registry: Registry;
  logger: Logger;
  /** One model call may take at most this long (default a minute). */
  timeoutMs?: number;
  /** Rewrites redone because the memory changed meanwhile, at most (default 5). */
  attempts?: number;
}

/**
 * Rewrites devices' memories after their conversations (public-api.md, "Memory"): one model call
 * from the memory so far and the conversation, written only over the revision it read. When the
 * memory changed meanwhile (the phone's edit, a rewrite on another node, forgetting) the rewrite is
 * redone on what is there now, so that neither the edit nor the other conversation is lost.
 */
export class MemoryRewriter {
  private readonly o: MemoryRewriterOptions;
  private readonly results: Counter<"result">;
  private readonly seconds: Histogram<"result">;
  private readonly running = new Set<Promise<RewriteResult>>();
  /** Each device's last rewrite submitted here: the next waits for it (the same node's rewrites would only redo each other). */
  private readonly lastOf = new Map<string, Promise<RewriteResult>>();
  private readonly abort = new AbortController();

  constructor(o: MemoryRewriterOptions) {
    this.o = o;
    this.results = new Counter({
      name: "perch_memory_rewrites_total",
      help: "Memory rewrites after conversations by result (ok, failed, skipped: no user words, remembering off or forgotten)",
      labelNames: ["result"],
      registers: [o.registry],
    });
    for (const result of ["ok", "failed", "skipped"]) this.results.inc({ result }, 0);
    this.seconds = new Histogram({
      name: "perch_memory_rewrite_seconds",
      help: "Memory rewrites' duration (model calls and writes, redone ones included)",
      labelNames: ["result"],
      buckets: [0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60],
      registers: [o.registry],
    });
  }

  /** Starts the rewrite in the background; the promise never rejects. */
  submit(job: RewriteJob): Promise<RewriteResult> {
    // One at a time per device on this node: concurrent ones would each redo after the other's write,
    // and past `attempts` a conversation would be lost. Other nodes' are met by the revision check.
    const before = this.lastOf.get(job.deviceKey);
    const run = before ? before.then(() => this.rewrite(job)) : this.rewrite(job);
    this.lastOf.set(job.deviceKey, run);
    this.running.add(run);
    void run.finally(() => {
      this.running.delete(run);
      if (this.lastOf.get(job.deviceKey) === run) this.lastOf.delete(job.deviceKey);
    });
    return run;
  }

  /** Resolves once every rewrite started so far is done. */
  async settled(): Promise<void> {
    while (this.running.size > 0) await Promise.all([...this.running]);
  }

  /** Shutdown: rewrites still running after `graceMs` are aborted (they change nothing). */
  async close(graceMs = 5_000): Promise<void> {
    const timer = setTimeout(() => this.abort.abort(new Error("the server is stopping")), graceMs);
    try {
      await this.settled();
    } finally {
      clearTimeout(timer);
    }
  }

  private async rewrite(job: RewriteJob): Promise<RewriteResult> {
    const started = performance.now();
    const log = { peer: job.deviceKey };
    const done = (result: RewriteResult, details: Record<string, unknown>, message: string) => {
      this.results.inc({ result });
      this.seconds.observe({ result }, (performance.now() - started) / 1000);
      this.o.logger[result === "failed" ? "warn" : "info"]({ ...log, result, ms: Math.round(performance.now() - started), ...details }, message);
      return result;
    };
    if (!job.said.some((l) => l.role === "user" && l.text.trim())) return done("skipped", { reason: "no user words" }, "memory not rewritten");
    const attempts = this.o.attempts ?? 5;
    try {
      for (let attempt = 1; attempt <= attempts; attempt++) {
        const base = await this.o.memory.rewriteBase(job.deviceKey, job.startedAt);
        if (!base) return done("skipped", { reason: "remembering is off, or was forgotten since the conversation began" }, "memory not rewritten");
        const signal = AbortSignal.any([this.abort.signal, AbortSignal.timeout(this.o.timeoutMs ?? 60_000)]);
        const answer = await this.o.complete(job.deviceKey, job.policy.model, rewriteMessages(base.text, job.said, job.policy.max_chars), signal);
        const text = fitMemory(answer, job.policy.max_chars);
        this.o.logger.debug({ ...log, attempt, memory: text }, "memory rewritten by the model");
        if (await this.o.memory.replace(job.deviceKey, base, text)) return done("ok", { attempt, chars: text.length }, "memory rewritten");
        // Changed since it was read: rewritten again from what is there now.
      }
      return done("failed", { reason: `the memory kept changing during ${attempts} rewrites` }, "memory rewrite failed");
    } catch (err) {
      // Only the message: a model's error may quote what it was given.
      return done("failed", { error: err instanceof Error ? err.message : String(err) }, "memory rewrite failed");
    }
  }
}
