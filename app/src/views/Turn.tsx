import { useSignal } from "@preact/signals";
import { useEffect } from "preact/hooks";
import { fetchBlob } from "../api.ts";
import type { ConversationEntry, TurnMetrics, TurnRecording } from "../types.ts";

/** A step of a turn's timeline: its name and how long it took (ms). */
interface Step {
  name: string;
  ms: number;
}

function ms(n: number): string {
  return n >= 1000 ? `${(n / 1000).toFixed(2)} s` : `${Math.round(n)} ms`;
}

/**
 * The turn's timeline from its `turn.metrics`: end of speech → transcript → first text → first
 * audio. A realtime agent's turn has only its speech-to-audio time (the model heard and spoke).
 */
export function timelineSteps(m: TurnMetrics): Step[] {
  const num = (v: unknown) => (typeof v === "number" && Number.isFinite(v) && v >= 0 ? v : undefined);
  const steps: Step[] = [];
  const endOfSpeech = num(m.end_of_speech);
  const transcription = num(m.transcription);
  const firstToken = num(m.first_token);
  if (endOfSpeech !== undefined) steps.push({ name: "End of speech", ms: endOfSpeech });
  if (transcription !== undefined) steps.push({ name: "Transcript", ms: transcription });
  if (firstToken !== undefined) steps.push({ name: "First text", ms: firstToken });
  const total = num(m.speech_to_audio);
  if (total !== undefined) {
    const before = steps.reduce((sum, s) => sum + s.ms, 0);
    steps.push({ name: "First audio", ms: Math.max(0, total - before) });
  }
  return steps;
}

/** A turn's timeline: each step as a bar proportional to its time, the tool calls of the turn, and the total. */
function Timeline({ turn, metrics, tools }: { turn: number; metrics: TurnMetrics; tools: ConversationEntry[] }) {
  const steps = timelineSteps(metrics);
  const total = steps.reduce((sum, s) => sum + s.ms, 0);
  return (
    <div class="timeline">
      <ol aria-label={`Timeline of turn ${turn}`}>
        {steps.map((s, i) => (
          <li key={s.name} class={`step step-${i}`}>
            <span class="step-name">{s.name}</span>
            <span class="step-bar" aria-hidden="true">
              <span style={{ width: `${total > 0 ? Math.max(2, (s.ms / total) * 100) : 0}%` }} />
            </span>
            <span class="step-ms">{ms(s.ms)}</span>
          </li>
        ))}
      </ol>
      <p class="muted timeline-total">
        {total > 0 ? `Speech to audio ${ms(total)}` : "No reply audio"}
        {metrics.interrupted ? " · interrupted" : ""}
      </p>
      {tools.length > 0 && (
        <ul class="timeline-tools" aria-label={`Tool calls of turn ${turn}`}>
          {tools.map((t, i) => (
            <li key={`${t.tool?.name}:${i}`} class={t.tool?.is_error ? "failed" : ""}>
              Tool {t.tool?.name ?? "call"}
              {t.tool?.is_error ? " failed" : ""}
            </li>
          ))}
        </ul>
      )}
    </div>
  );
}

/** One side of a turn: a button that fetches the recording with the bearer, then a player of it. */
function SidePlayer({ path, bearer, label, recording }: { path: string; bearer: string; label: string; recording: TurnRecording }) {
  const url = useSignal<string | undefined>(undefined);
  const state = useSignal<"idle" | "loading" | "failed">("idle");
  useEffect(
    () => () => {
      if (url.value) URL.revokeObjectURL(url.value);
    },
    [],
  );
  const load = async () => {
    state.value = "loading";
    try {
      const blob = await fetchBlob(`${path}/turns/${recording.turn}/audio?side=${recording.side}`, bearer);
      url.value = URL.createObjectURL(blob);
      state.value = "idle";
    } catch {
      state.value = "failed";
    }
  };
  const seconds = (recording.duration_ms / 1000).toFixed(1);
  if (url.value) {
    return (
      <span class="side">
        <span class="side-name">
          {label} · {seconds} s
        </span>
        {/* biome-ignore lint/a11y/useMediaCaption: a recording of speech whose transcript is the bubble above */}
        <audio controls autoplay src={url.value} aria-label={`${label}, turn ${recording.turn}`} />
      </span>
    );
  }
  return (
    <span class="side">
      <button
        type="button"
        class="secondary"
        onClick={load}
        disabled={state.value === "loading"}
        aria-label={`Play ${label.toLowerCase()}, turn ${recording.turn}`}
      >
        ▶ {label} · {seconds} s
      </button>
      {state.value === "failed" && (
        <span class="error" role="alert">
          The recording could not be loaded.
        </span>
      )}
    </span>
  );
}

/** What happened in one stored turn: its two sides to play (when kept) and its timeline (when its metrics are). */
export function TurnDetails({
  turn,
  entries,
  recordings,
  path,
  bearer,
}: {
  turn: number;
  entries: ConversationEntry[];
  recordings: TurnRecording[];
  path: string;
  bearer: string;
}) {
  const metrics = entries.find((e) => e.metrics)?.metrics;
  const user = recordings.find((r) => r.side === "user");
  const reply = recordings.find((r) => r.side === "assistant");
  if (!metrics && !user && !reply) return null;
  return (
    <li class="turn-details" aria-label={`Turn ${turn}`}>
      {(user || reply) && (
        <div class="sides">
          {user && <SidePlayer path={path} bearer={bearer} label="Heard" recording={user} />}
          {reply && <SidePlayer path={path} bearer={bearer} label="Reply" recording={reply} />}
        </div>
      )}
      {metrics && <Timeline turn={turn} metrics={metrics} tools={entries.filter((e) => e.role === "tool")} />}
    </li>
  );
}
