import type { VoiceEvent } from "../voice/peer-events.ts";

/**
 * Whether a device is talking, read from the voice events its connection sends (voice.md §3): a
 * turn is open from its `BOS user.audio` (`in-n`) until its `TEXT_DONE turn.metrics` (`out-n`),
 * which every turn ends with, its reply included; and the device counts as talking for
 * `quietMs` (`voice.turn.silence_ms`) after its last voice event, so that a user who speaks again
 * right after a reply is not cut. A turn with no event for `staleMs` (its conversation ended
 * without one) no longer counts. A drain hands a connection over only when it is not talking
 * (fleet.md §3): never mid-reply.
 */
export class TalkState {
  private readonly open = new Set<string>();
  private lastAt = Number.NEGATIVE_INFINITY;
  private readonly quietMs: number;
  private readonly staleMs: number;

  constructor(quietMs: number, staleMs: number) {
    this.quietMs = quietMs;
    this.staleMs = staleMs;
  }

  /** An event the connection sent at `now` (ms, any monotonic clock). */
  sent(event: VoiceEvent, now: number): void {
    const turn = /^(?:in|out)-(\d+)$/.exec(event.streamId)?.[1];
    if (turn === undefined) return;
    this.lastAt = now;
    if (event.type === "bos" && event.label === "user.audio") this.open.add(turn);
    else if (event.type === "done" && event.label === "turn.metrics") this.open.delete(turn);
  }

  talking(now: number): boolean {
    const since = now - this.lastAt;
    if (since < this.quietMs) return true;
    return this.open.size > 0 && since < this.staleMs;
  }
}
