import { type EventBus, topics } from "../bus/index.ts";
import type { PeerMessage } from "../domain/changes.ts";
import { systemClock, type VoiceClock } from "./clock.ts";
import type { AgentChoice } from "./conversation.ts";
import type { VoiceEngines } from "./engine-ports.ts";

const DEFAULT_VOICE = "alloy";
/** How soon a failed read of the device's choice is tried again. */
export const AGENT_READ_RETRY_MS = 2_000;

export interface DeviceAgentOptions {
  key: string;
  /** The device's stored choice: an agent id, `off`, null for `voice.agent`; undefined when unregistered (read as null). */
  read: () => Promise<string | null | undefined>;
  bus: EventBus;
  /** `voice.agent`, and the agents that can converse with their engines. */
  defaultAgent: string | undefined;
  agents: ReadonlyArray<{ id: string; voice?: string | undefined; language?: string | undefined }>;
  engines: ReadonlyMap<string, VoiceEngines>;
  onReadError: (err: unknown) => void;
  clock?: VoiceClock;
}

/**
 * A device's agent: its own choice, else `voice.agent`. Read from the store once, then taken from
 * the `voice` messages on `topics.peers` (an operator's `perch peers voice`, from any process and on
 * every node, reaches the live conversation); read again after the bus missed messages. Until a
 * read succeeds no turn starts (the device may be `off`); a failed read is tried again.
 */
export class DeviceAgentChoice {
  private readonly o: DeviceAgentOptions;
  private readonly clock: VoiceClock;
  /** undefined until known. */
  private setting: string | null | undefined;
  /** Counts the settings taken from messages: a read that started before one is stale. */
  private changes = 0;
  private readonly unsubscribe: () => void;
  private cancelRetry: (() => void) | undefined;
  private closed = false;

  constructor(o: DeviceAgentOptions) {
    this.o = o;
    this.clock = o.clock ?? systemClock;
    this.unsubscribe = o.bus.subscribe(topics.peers, {
      message: (m) => {
        const message = m as PeerMessage;
        if (message.kind !== "voice" || message.key !== o.key) return;
        this.changes++;
        this.setting = message.agent;
      },
      gap: () => this.read(),
    });
    this.read();
  }

  /** The id of the agent chosen now (whatever its kind), or undefined: voice off, or not known yet. */
  chosenId(): string | undefined {
    if (this.setting === undefined) return undefined;
    return (this.setting === null ? this.o.defaultAgent : this.setting === "off" ? undefined : this.setting) || undefined;
  }

  current(): AgentChoice | undefined {
    const id = this.chosenId();
    if (!id) return undefined;
    const agent = this.o.agents.find((a) => a.id === id);
    const engines = agent && this.o.engines.get(agent.id);
    if (!agent || !engines) return undefined;
    return { id: agent.id, voice: agent.voice ?? DEFAULT_VOICE, engines, ...(agent.language ? { language: agent.language } : {}) };
  }

  close(): void {
    this.closed = true;
    this.cancelRetry?.();
    this.unsubscribe();
  }

  private read(): void {
    if (this.closed) return;
    this.cancelRetry?.();
    this.cancelRetry = undefined;
    const changes = this.changes;
    this.o.read().then(
      (setting) => {
        if (this.changes === changes) this.setting = setting ?? null;
      },
      (err: unknown) => {
        // Unreadable (the store away): what was known stays (nothing, at first), and it is read again.
        this.o.onReadError(err);
        if (this.closed || this.changes !== changes) return;
        this.cancelRetry = this.clock.after(AGENT_READ_RETRY_MS, () => this.read());
      },
    );
  }
}
