import { notesMessage, type SaidLine } from "../ai/memory-prompt.ts";
import type { AgentConfig } from "../config/config.ts";
import { type MemoryPolicy, memoryPolicy } from "../domain/memory.ts";
import type { ChatMessage } from "../protocol/compat.ts";
import type { VoiceClock } from "./clock.ts";
import type { RewriteJob } from "./memory-rewriter.ts";
import type { TranscriptEntry } from "./transcript.ts";

export interface MemoryKeeperOptions {
  deviceKey: string;
  agents: readonly AgentConfig[];
  /** The device's memory, read when a conversation starts (undefined: its people turned it off). */
  read: () => Promise<{ text: string | undefined }>;
  /** An ended conversation's rewrite (in the background). */
  rewrite: (job: RewriteJob) => void;
  /** The domain clock (conversation start times compare with forgetting's). */
  now: () => number;
  /** Idle timers. */
  clock: VoiceClock;
  onReadError: (err: unknown) => void;
}

/** Lines of a conversation kept for its rewrite at most (the oldest go first). */
const MAX_LINES = 400;

/**
 * The memory of one connection's conversations: read once when a conversation starts and given to
 * every turn's model as notes after the agent's instructions (no read per turn, so no added
 * latency); the conversation's words collected, and when it ends (the connection closes, or no turn
 * for the agent's `idle_ms`) handed to the rewrite. After an idle end the next turn begins a new
 * conversation with the memory read again then (one store read on that turn).
 */
export class MemoryKeeper {
  private readonly o: MemoryKeeperOptions;
  /** The conversation's memory, read when it began; undefined between conversations (after an idle end). */
  private memory: Promise<{ text: string | undefined }> | undefined;
  private said: SaidLine[] = [];
  private startedAt: number | undefined;
  /** The agent that answered the conversation's last turn, whose memory settings apply. */
  private policy: MemoryPolicy | undefined;
  private cancelIdle: (() => void) | undefined;
  private closed = false;

  constructor(o: MemoryKeeperOptions) {
    this.o = o;
    // The first conversation begins with the connection: its memory is read before its first turn.
    this.begin();
  }

  /** The system message a turn of `agentId` adds after the agent's instructions; none when the agent does not remember or there is nothing. */
  async notes(agentId: string): Promise<ChatMessage | undefined> {
    const policy = memoryPolicy(this.o.agents, agentId);
    if (!policy) return undefined;
    this.policy = policy;
    this.touch();
    const { text } = await this.begin();
    return text ? notesMessage(text) : undefined;
  }

  /** A finished line of the conversation (user words and what was spoken; tool results are not remembered). */
  entry(e: TranscriptEntry): void {
    if (this.closed || e.role === "tool") return;
    void this.begin();
    this.said.push({ role: e.role, text: e.text });
    if (this.said.length > MAX_LINES) this.said.splice(0, this.said.length - MAX_LINES);
    this.touch();
  }

  /** A turn happened: the conversation ends `idle_ms` after the last one. */
  private touch(): void {
    if (this.closed) return;
    this.cancelIdle?.();
    const idle = this.policy?.idle_ms;
    this.cancelIdle = idle === undefined ? undefined : this.o.clock.after(idle, () => this.end(true));
  }

  /** The connection closed: its conversation ends. */
  close(): void {
    if (this.closed) return;
    this.end(false);
    this.closed = true;
  }

  private end(idle: boolean): void {
    this.cancelIdle?.();
    this.cancelIdle = undefined;
    const said = this.said;
    const policy = this.policy;
    this.said = [];
    if (policy && said.length > 0) this.o.rewrite({ deviceKey: this.o.deviceKey, startedAt: this.startedAt ?? this.o.now(), policy, said });
    if (!idle) return;
    // The next turn begins a new conversation, with the memory as it is then (forgotten, turned
    // off or edited since this one ended), not as it was now.
    this.startedAt = undefined;
    this.memory = undefined;
  }

  /** The conversation under way's memory; the first use after an idle end begins a new conversation (and reads it). */
  private begin(): Promise<{ text: string | undefined }> {
    if (this.memory) return this.memory;
    this.startedAt = this.o.now();
    this.memory = this.read();
    return this.memory;
  }

  private read(): Promise<{ text: string | undefined }> {
    return this.o.read().catch((err: unknown) => {
      // Unreadable (the store away): this conversation goes on without it.
      this.o.onReadError(err);
      return { text: undefined };
    });
  }
}
