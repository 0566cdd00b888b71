import { useSignal } from "@preact/signals";
import { useEffect } from "preact/hooks";
import { ApiError, request } from "../api.ts";
import { sessionProblem } from "../live.ts";
import { connectedCount, usageChanged } from "../state.ts";
import type { LimitCounter, Usage } from "../types.ts";

const NAMES: Record<LimitCounter, string> = {
  requests: "Conversations and requests",
  tokens: "Words the assistant read and wrote (tokens)",
  speech_chars: "Characters spoken",
  audio_seconds: "Seconds of speech heard",
};

function usedOf(u: Usage["day"], counter: LimitCounter): number {
  return counter === "tokens" ? u.used.input_tokens + u.used.output_tokens : u.used[counter];
}

function amount(n: number, counter: LimitCounter): string {
  return counter === "audio_seconds" ? `${Math.round(n)} s` : Math.round(n).toLocaleString();
}

function time(ms: number): string {
  return new Date(ms).toLocaleString(undefined, { weekday: "short", hour: "numeric", minute: "2-digit" });
}

/** One limit: what was used against it, as a bar and in numbers. */
function Meter({ label, used, limit, counter }: { label: string; used: number; limit: number; counter: LimitCounter }) {
  const share = limit > 0 ? Math.min(1, used / limit) : 1;
  return (
    <li class={`usage-row${used >= limit ? " reached" : ""}`}>
      <span class="usage-label">{label}</span>
      <progress max={1} value={share} aria-label={`${label}: ${amount(used, counter)} of ${amount(limit, counter)}`} />
      <span class="usage-numbers">
        {amount(used, counter)} / {amount(limit, counter)}
      </span>
    </li>
  );
}

/**
 * What the device used today against each of its limits (`GET /side-control/usage`, again on each
 * `usage` event), and a clear line while a limit stops it: it then answers with its rest reply.
 */
export function Today({ bearer }: { bearer: string }) {
  const usage = useSignal<Usage | undefined>(undefined);
  const problem = useSignal<string | undefined>(undefined);
  const reconnects = connectedCount.value;
  const told = usageChanged.value;

  useEffect(() => {
    if (told) usage.value = told;
    const abort = new AbortController();
    request<Usage>("GET", "/side-control/usage", { bearer, signal: abort.signal }).then(
      (u) => {
        usage.value = u;
        problem.value = undefined;
      },
      (err: unknown) => {
        if ((err as Error)?.name === "AbortError" || sessionProblem(err)) return;
        problem.value =
          err instanceof ApiError && err.status === 0 ? "The server cannot be reached. Try again in a moment." : "Today's use could not be loaded.";
      },
    );
    return () => abort.abort();
  }, [bearer, reconnects, told]);

  const u = usage.value;
  const limits = u ? (Object.entries(u.day.limits) as Array<[LimitCounter, number]>) : [];
  const monthly = u ? (Object.entries(u.month.limits) as Array<[LimitCounter, number]>) : [];
  return (
    <section class="card today" aria-labelledby="today-heading">
      <h2 id="today-heading">Today</h2>
      {u?.limited && (
        <p class="limited" role="alert">
          Resting: the device reached its {NAMES[u.limited].toLowerCase()} limit. It answers with a short goodbye until{" "}
          {time((u.month.limits[u.limited] !== undefined && usedOf(u.month, u.limited) >= u.month.limits[u.limited]! ? u.month : u.day).resets_at_unix_ms)}.
        </p>
      )}
      {u && (
        <>
          {limits.length > 0 ? (
            <ul class="usage">
              {limits.map(([c, limit]) => (
                <Meter key={c} counter={c} label={NAMES[c]} used={usedOf(u.day, c)} limit={limit} />
              ))}
            </ul>
          ) : (
            <p class="muted">No daily limit is set for this device.</p>
          )}
          {monthly.length > 0 && (
            <>
              <h3>This month</h3>
              <ul class="usage">
                {monthly.map(([c, limit]) => (
                  <Meter key={c} counter={c} label={NAMES[c]} used={usedOf(u.month, c)} limit={limit} />
                ))}
              </ul>
            </>
          )}
          <p class="muted usage-summary">
            Today: {u.day.used.requests} conversations and requests, {Math.round(u.day.used.audio_seconds)} s heard, {u.day.used.speech_chars.toLocaleString()}{" "}
            characters spoken. Resets at {time(u.day.resets_at_unix_ms)}.
          </p>
        </>
      )}
      {problem.value && (
        <p class="error" role="alert">
          {problem.value}
        </p>
      )}
    </section>
  );
}
