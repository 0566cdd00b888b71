import { Counter, Gauge, Histogram, type Registry } from "prom-client";

export type TurnResult = "answered" | "empty" | "interrupted" | "failed" | "limited";
export const STAGES = ["end_of_speech", "end_of_utterance_delay", "transcription", "first_token", "ttft", "ttfb", "first_audio", "speech_to_audio"] as const;
export type Stage = (typeof STAGES)[number];

/** voice.md §4. */
export class VoiceMetrics {
  private readonly turns: Counter<"result">;
  private readonly stages: Histogram<"stage" | "engine">;
  private readonly late: Counter;
  private readonly frames: Counter;
  private readonly dropped: Counter;
  private readonly packets: { decoded: Counter.Internal; silent: Counter.Internal };
  private readonly falseInterruptions: Counter;
  private readonly preemptives: Counter<"result">;

  constructor(registry: Registry, conversations: () => number) {
    this.turns = new Counter({ name: "perch_voice_turns_total", help: "Voice turns by result", labelNames: ["result"], registers: [registry] });
    this.stages = new Histogram({
      name: "perch_voice_stage_seconds",
      help: "Voice turn stages (turn.metrics)",
      labelNames: ["stage", "engine"],
      buckets: [0.025, 0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1, 1.5, 2, 3, 5, 10],
      registers: [registry],
    });
    new Gauge({
      name: "perch_voice_conversations",
      help: "Voice conversations open on this node",
      registers: [registry],
      collect() {
        this.set(conversations());
      },
    });
    this.frames = new Counter({
      name: "perch_voice_frames_total",
      help: "Downlink voice frames sent (the denominator of the late share)",
      registers: [registry],
    });
    this.dropped = new Counter({
      name: "perch_voice_uplink_dropped_seconds_total",
      help: "Uplink audio dropped undecoded: what devices claimed beyond real time",
      registers: [registry],
    });
    const packets = new Counter({
      name: "perch_voice_uplink_packets_total",
      help: "Uplink Opus packets by what they cost: decoded, or silent (DTX, or an audio level of silence) and not decoded",
      labelNames: ["decoding"],
      registers: [registry],
    });
    this.packets = { decoded: packets.labels("decoded"), silent: packets.labels("silent") };
    this.falseInterruptions = new Counter({
      name: "perch_voice_false_interruptions_total",
      help: "Speech over a reply that was no barge-in: the reply paused and resumed (voice.md §7)",
      registers: [registry],
    });
    this.preemptives = new Counter({
      name: "perch_voice_preemptive_total",
      help: "Replies asked of the model in a pause, by what became of them (used, discarded)",
      labelNames: ["result"],
      registers: [registry],
    });
    this.late = new Counter({
      name: "perch_voice_frames_late_total",
      help: "Downlink voice frames sent more than 20 ms after their time",
      registers: [registry],
    });
  }

  /**
   * A finished turn. Each stage is labelled with the engine that took it: the transcription's for
   * `transcription`, the speech engine's for `ttfb`, `first_audio` and `speech_to_audio`, the node's
   * own detector (`embedded`) for `end_of_speech` and `end_of_utterance_delay`, and `model` for
   * `first_token` and `ttft` (the chat model's).
   */
  turn(result: TurnResult, stages: Partial<Record<Stage, number>>, engines: { transcription: string; speech: string }): void {
    this.turns.inc({ result });
    const engine: Record<Stage, string> = {
      end_of_speech: "embedded",
      end_of_utterance_delay: "embedded",
      transcription: engines.transcription,
      first_token: "model",
      ttft: "model",
      ttfb: engines.speech,
      first_audio: engines.speech,
      speech_to_audio: engines.speech,
    };
    for (const [stage, ms] of Object.entries(stages) as Array<[Stage, number]>)
      if (typeof ms === "number" && Number.isFinite(ms)) this.stages.observe({ stage, engine: engine[stage] }, ms / 1000);
  }

  falseInterruption(): void {
    this.falseInterruptions.inc();
  }

  preemptive(result: "used" | "discarded"): void {
    this.preemptives.inc({ result });
  }

  frameLate(): void {
    this.late.inc();
  }

  uplinkDropped(seconds: number): void {
    this.dropped.inc(seconds);
  }

  /** Uplink packets since the last call: decoded, and silent (not decoded). */
  uplinkPackets(decoded: number, silent: number): void {
    if (decoded > 0) this.packets.decoded.inc(decoded);
    if (silent > 0) this.packets.silent.inc(silent);
  }

  frameSent(): void {
    this.frames.inc();
  }
}
