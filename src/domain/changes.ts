import { type BusMessage, type EventBus, topics } from "../bus/index.ts";
import type { ConversationEntry, PeerStatus, TelemetryField, UsageView } from "../protocol/public.ts";
import { splitText } from "../protocol/text.ts";
import type { Repositories } from "../store/index.ts";

/** A status document larger than this is not carried in its message; subscribers read it from the store. */
const INLINE_STATUS_BYTES = 4_000;
/** Telemetry values per message (each under 100 bytes of JSON, so a message stays within the bus limit). */
const VALUES_PER_MESSAGE = 60;

/** What is published on a device's topic (`topics.device(key)`), after the write it tells of committed. */
export type DeviceMessage =
  /** `v`: the store's `updated_at` of the document (later writes have later or equal ones); `status` is absent when too large to carry. */
  | { kind: "status"; v: number; status?: PeerStatus }
  | { kind: "runtime"; online: boolean; node: string | null }
  | { kind: "telemetry"; values: Array<[field: TelemetryField, value: number, observedAt: number]> }
  | { kind: "contacts"; name: string; change: "created" | "updated" | "deleted" }
  /**
   * A conversation entry, its text in `parts` messages (one when it fits): `e` is the entry without
   * its text, `s` its place in the conversation, `p` this part (from 0), `t` this part's text.
   */
  | { kind: "conversation"; e: Omit<ConversationEntry, "text">; s: number; p: number; parts: number; t: string }
  /** The device's memory changed (edited, rewritten, forgotten, turned on or off) at `at`. */
  | { kind: "memory"; at: number }
  /** The device's usage now: a limit was reached, or it reset (usage.md §3). */
  | { kind: "usage"; usage: UsageView };

/** A session's end, on `topics.session(id)`. */
export type SessionMessage = { kind: "revoked" };

/**
 * On `topics.peers`, from any process sharing the database: an operator blocked, unblocked or
 * removed a peer, or set its voice agent (`agent`: an agent id, `off`, or null for `voice.agent`).
 */
export type PeerMessage = { kind: "blocked" | "unblocked" | "removed"; key: string } | { kind: "voice"; key: string; agent: string | null };

/** Text of a conversation entry per message (as JSON), leaving room within the bus's limit for the rest of the entry. */
const CONVERSATION_PART_BYTES = 5_000;

/** `text` in pieces whose JSON string forms are each at most `max` bytes, cut between characters. */
export function splitJsonText(text: string, max: number): string[] {
  return splitText(text, max, (s) => Buffer.byteLength(JSON.stringify(s)));
}

/** The domain's side of the event bus: typed publishing of what changed. */
export class DomainEvents {
  readonly bus: EventBus;

  constructor(bus: EventBus) {
    this.bus = bus;
  }

  status(key: string, status: PeerStatus, v: number): void {
    // Most devices are watched by nobody: measuring and serialising their documents was a tenth of ingest.
    if (!this.bus.listened(topics.device(key))) return;
    const inline = JSON.stringify(status).length <= INLINE_STATUS_BYTES;
    this.device(key, inline ? { kind: "status", v, status } : { kind: "status", v });
  }

  runtime(key: string, online: boolean, node: string | null): void {
    this.device(key, { kind: "runtime", online, node });
  }

  telemetry(key: string, samples: ReadonlyArray<{ field: TelemetryField; value: number; observedAt: number }>): void {
    if (!this.bus.listened(topics.device(key))) return;
    for (let i = 0; i < samples.length; i += VALUES_PER_MESSAGE) {
      const values = samples.slice(i, i + VALUES_PER_MESSAGE).map((s) => [s.field, s.value, s.observedAt] as [TelemetryField, number, number]);
      this.device(key, { kind: "telemetry", values });
    }
  }

  contacts(key: string, name: string, change: "created" | "updated" | "deleted"): void {
    this.device(key, { kind: "contacts", name, change });
  }

  memory(key: string, at: number): void {
    this.device(key, { kind: "memory", at });
  }

  usage(key: string, usage: UsageView): void {
    this.device(key, { kind: "usage", usage });
  }

  /** A conversation entry (number `seq` of its conversation); a long text goes in several messages. */
  conversation(key: string, entry: ConversationEntry, seq: number): void {
    const { text, ...e } = entry;
    const pieces = splitJsonText(text, CONVERSATION_PART_BYTES);
    for (const [p, t] of pieces.entries()) this.device(key, { kind: "conversation", e, s: seq, p, parts: pieces.length, t });
  }

  /** From inside the transaction that revoked the session; see `announce`. */
  sessionRevoked(tx: Repositories, sessionId: string): Promise<() => void> {
    return this.announce(tx, topics.session(sessionId), { kind: "revoked" } satisfies SessionMessage);
  }

  /** From inside the transaction that blocked, unblocked or removed the peer; see `announce`. */
  peer(tx: Repositories, key: string, kind: "blocked" | "unblocked" | "removed"): Promise<() => void> {
    return this.announce(tx, topics.peers, { kind, key } satisfies PeerMessage);
  }

  /** From inside the transaction that set the peer's voice agent: its live conversation on any node takes it; see `announce`. */
  voiceAgent(tx: Repositories, key: string, agent: string | null): Promise<() => void> {
    return this.announce(tx, topics.peers, { kind: "voice", key, agent } satisfies PeerMessage);
  }

  /**
   * A change to a peer or a session, announced from inside its transaction: the message is written
   * there for the other processes sharing a SQLite file (`bus_messages`, read by their
   * `SqliteBus`), and the returned function publishes it on the bus; call it once committed.
   */
  private async announce(tx: Repositories, topic: string, message: SessionMessage | PeerMessage): Promise<() => void> {
    await tx.busMessages.add(this.bus.instance, topic, message, Date.now());
    return () => this.bus.publish(topic, message);
  }

  private device(key: string, message: DeviceMessage): void {
    this.bus.publish(topics.device(key), message as unknown as BusMessage);
  }
}
