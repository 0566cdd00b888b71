import { type Admission, UsageLimited, type UsageMeter, type Who } from "../domain/usage-meter.ts";
import type { SpeechChunk, SpeechPort, SynthesisRequest } from "./engine-ports.ts";
import type { RealtimeCounts } from "./realtime/activity.ts";

/** What a voice turn asks of usage (usage.md §1–3): admission, its counts, and the limited reply. */
export interface TurnUsage {
  /** Admits a turn of `agentId`, or says which counter's limit refuses it. A store error admits it (usage.md §4). */
  admit(agentId: string): Promise<{ admission: Admission } | { limited: string }>;
  /** Counts of the conversation's work with `agentId` (the turn's audio heard, characters spoken). */
  record(agentId: string, counts: Parameters<Admission["add"]>[0]): void;
  /** The agent's limited reply, and the speech port that speaks it from a kept copy. */
  limitedReply(agentId: string, speech: SpeechPort): { text: string; speech: SpeechPort };
}

/** A device's turns as the node's meter counts and limits them. */
export function deviceTurnUsage(meter: UsageMeter, key: string, replies: LimitedReplies): TurnUsage {
  const who: Who = { id: `device:${key}`, device: key };
  return {
    async admit(agentId) {
      try {
        const admitted = meter.admit(who, agentId);
        return { admission: admitted instanceof Promise ? await admitted : admitted };
      } catch (err) {
        if (err instanceof UsageLimited) return { limited: err.limit.counter };
        throw err;
      }
    },
    record: (agentId, counts) => meter.record(who, agentId, counts),
    limitedReply: (agentId, speech) => replies.for(agentId, speech),
  };
}

/** A speech port whose characters are counted as they are synthesised. */
export function countedSpeech(port: SpeechPort, count: (chars: number) => void): SpeechPort {
  return {
    engine: port.engine,
    synthesize(request: SynthesisRequest): AsyncIterable<SpeechChunk> {
      count(request.text.length);
      return port.synthesize(request);
    },
  };
}

/**
 * Each agent's limited reply (`limited_reply`), synthesised once in the agent's voice and kept:
 * a device told to rest costs no synthesis after the first.
 */
export class LimitedReplies {
  private readonly texts: Map<string, string>;
  private readonly kept = new Map<string, SpeechChunk[]>();

  constructor(agents: ReadonlyArray<{ id: string; limited_reply: string }>) {
    this.texts = new Map(agents.map((a) => [a.id, a.limited_reply]));
  }

  for(agentId: string, speech: SpeechPort): { text: string; speech: SpeechPort } {
    const text = this.texts.get(agentId) ?? "";
    const kept = this.kept;
    return {
      text,
      speech: {
        engine: speech.engine,
        async *synthesize(request) {
          const key = `${speech.engine}\0${request.voice}\0${request.text}`;
          const copy = kept.get(key);
          if (copy) {
            for (const chunk of copy) {
              request.signal.throwIfAborted();
              yield chunk;
            }
            return;
          }
          const chunks: SpeechChunk[] = [];
          for await (const chunk of speech.synthesize(request)) {
            chunks.push(chunk);
            yield chunk;
          }
          // Kept only once whole (a barge-in may have cut this one).
          kept.set(key, chunks);
        },
      },
    };
  }
}

/** What a device's realtime conversation asks of usage: whether it is limited now, and the counts of its sessions. */
export interface RealtimeUsage {
  /** Whether a limit of the device's use of `agentId` is reached (checked against the store at most once a second). */
  limited(agentId: string): boolean;
  counts(agentId: string): RealtimeCounts;
}

/** How often a realtime conversation asks the store whether its device is limited. */
const REALTIME_CHECK_MS = 1_000;
const REALTIME_RATE = 24_000;

export function deviceRealtimeUsage(meter: UsageMeter, key: string, now: () => number = Date.now): RealtimeUsage {
  const who: Who = { id: `device:${key}`, device: key };
  const known = new Map<string, boolean>();
  let checkedAt = Number.NEGATIVE_INFINITY;
  let checking = false;
  return {
    limited(agentId) {
      if (!checking && now() - checkedAt >= REALTIME_CHECK_MS) {
        checking = true;
        meter
          .limitedNow(who, agentId)
          .then(
            (limit) => known.set(agentId, limit !== undefined),
            () => {},
          )
          .finally(() => {
            checking = false;
            checkedAt = now();
          });
      }
      return known.get(agentId) === true || meter.limitedCached(who, agentId);
    },
    counts: (agentId) => ({
      audio: (samples) => meter.record(who, agentId, { audio_ms: Math.round((samples * 1000) / REALTIME_RATE) }),
      tokens: (input, output) => meter.record(who, agentId, { input_tokens: input, output_tokens: output }),
      answered: () => meter.record(who, agentId, { requests: 1 }),
    }),
  };
}
