import { randomUUID } from "node:crypto";
import type { AgentConfig } from "../config/config.ts";
import type { MemoryUpdate, MemoryView } from "../protocol/public.ts";
import type { MemoryState } from "../store/memories.ts";
import type { DomainContext } from "./context.ts";
import { DomainError } from "./errors.ts";

/** An agent's memory settings, when it remembers. */
export type MemoryPolicy = Required<Pick<NonNullable<AgentConfig["memory"]>, "max_chars" | "idle_ms">> & { model: string };

/** The memory settings of agent `id`, when it remembers (`model` the rewriting chat model). */
export function memoryPolicy(agents: readonly AgentConfig[], id: string | undefined): MemoryPolicy | undefined {
  const agent = id === undefined ? undefined : agents.find((a) => a.id === id);
  if (!agent?.memory?.enabled) return undefined;
  return { max_chars: agent.memory.max_chars, idle_ms: agent.memory.idle_ms, model: agent.memory.model ?? agent.model };
}

/** Unicode code points of `text`. */
export function codePoints(text: string): number {
  let n = 0;
  for (const _ of text) n++;
  return n;
}

/** What a conversation reads when it starts: the text to give the model, when the device remembers. */
export interface ConversationMemory {
  /** The text ("" when none); undefined when the device's people turned memory off. */
  text: string | undefined;
}

/** A rewrite's view of the memory: what it rewrites from, and the revision its write must find. */
export interface RewriteBase {
  text: string;
  rev: string | undefined;
  /** When the conversation began: its write is refused if the memory was forgotten since, or turned off. */
  startedAt: number;
}

/**
 * A device's memory (public-api.md, "Memory"): read by its conversations, rewritten after them,
 * and seen, edited, turned off and forgotten by its Side Control. Every change is announced on the
 * device's topic (the `memory` event).
 */
export class MemoryService {
  private readonly ctx: DomainContext;

  constructor(ctx: DomainContext) {
    this.ctx = ctx;
  }

  /** The memory settings of the device's agent now (its own choice, else `voice.agent`), when it remembers. */
  policyOf(state: Pick<MemoryState, "voiceAgent">): MemoryPolicy | undefined {
    const id = state.voiceAgent === null ? this.ctx.config.voice.agent : state.voiceAgent === "off" ? undefined : state.voiceAgent;
    return memoryPolicy(this.ctx.config.agents, id);
  }

  async view(deviceKey: string): Promise<MemoryView> {
    return this.viewOf(await this.state(deviceKey));
  }

  /** The phone's edit and switch, in one transaction; 409 when the device's agent does not remember. */
  async update(deviceKey: string, update: MemoryUpdate): Promise<MemoryView> {
    const state = await this.state(deviceKey);
    const policy = this.policyOf(state);
    if (!policy) throw notEnabled();
    if (update.text !== undefined && codePoints(update.text) > policy.max_chars) {
      throw new DomainError("invalid", "INVALID_MEMORY", `text: at most ${policy.max_chars} characters`, { field: "text", max_chars: policy.max_chars });
    }
    const at = this.ctx.clock.now();
    const found = await this.ctx.store.transaction(async (tx) => {
      if (update.enabled !== undefined && !(await tx.memories.setOff(deviceKey, !update.enabled))) return false;
      if (update.text !== undefined && !(await tx.memories.put(deviceKey, update.text, randomUUID(), at))) return false;
      return true;
    });
    if (!found) throw gone();
    // Text replaced is overwritten in the database file; its old pages leave the log too.
    if (update.text !== undefined) await this.ctx.store.truncateLogSoon();
    this.ctx.events.memory(deviceKey, at);
    return this.view(deviceKey);
  }

  /** Forgets the text for good: the row deleted (overwritten on SQLite) and the SQLite log truncated. */
  async forget(deviceKey: string): Promise<void> {
    const at = this.ctx.clock.now();
    await this.ctx.store.transaction((tx) => tx.memories.forget(deviceKey, at));
    await this.ctx.store.truncateLogSoon();
    this.ctx.events.memory(deviceKey, at);
  }

  /** Read once when a conversation starts. */
  async forConversation(deviceKey: string): Promise<ConversationMemory> {
    const state = await this.ctx.store.read((r) => r.memories.state(deviceKey));
    return { text: !state || state.off ? undefined : (state.row?.text ?? "") };
  }

  /**
   * What a rewrite of a conversation that began at `startedAt` rewrites from; undefined when nothing
   * may be written: the device is gone, its people turned memory off, or forgot it after it began.
   */
  async rewriteBase(deviceKey: string, startedAt: number): Promise<RewriteBase | undefined> {
    const state = await this.ctx.store.read((r) => r.memories.state(deviceKey));
    if (!state || state.off || (state.forgottenAt !== null && state.forgottenAt >= startedAt)) return undefined;
    return { text: state.row?.text ?? "", rev: state.row?.rev, startedAt };
  }

  /**
   * A rewrite's write, only over the revision it read and while remembering is on and nothing was
   * forgotten since the conversation began; false otherwise (read it again and redo, or skip).
   */
  async replace(deviceKey: string, base: RewriteBase, text: string): Promise<boolean> {
    const at = this.ctx.clock.now();
    const written = await this.ctx.store.transaction((tx) => tx.memories.replace(deviceKey, base.rev, base.startedAt, text, randomUUID(), at));
    if (written) this.ctx.events.memory(deviceKey, at);
    return written;
  }

  /** The text for operators (`perch peers memory`): stored whatever the agent now. */
  async text(deviceKey: string): Promise<{ text: string; updated_at_unix_ms?: number } | undefined> {
    const state = await this.ctx.store.read((r) => r.memories.state(deviceKey));
    if (!state) return undefined;
    return state.row ? { text: state.row.text, updated_at_unix_ms: state.row.updated_at } : { text: "" };
  }

  private async state(deviceKey: string): Promise<MemoryState> {
    const state = await this.ctx.store.read((r) => r.memories.state(deviceKey));
    if (!state) throw gone();
    return state;
  }

  private viewOf(state: MemoryState): MemoryView {
    const policy = this.policyOf(state);
    const view: MemoryView = { enabled: policy !== undefined && !state.off, text: state.row?.text ?? "", max_chars: policy?.max_chars ?? 0 };
    if (state.row) view.updated_at_unix_ms = state.row.updated_at;
    return view;
  }
}

function notEnabled(): DomainError {
  return new DomainError("conflict", "MEMORY_NOT_ENABLED", "this device's agent does not remember (its agent has no `memory: {enabled: true}`)");
}

/** The target device was removed while the request ran (authentication checked it just before). */
function gone(): DomainError {
  return new DomainError("not_found", "PEER_NOT_FOUND", "the device is no longer registered");
}
