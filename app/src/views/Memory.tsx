import { useSignal } from "@preact/signals";
import { useEffect } from "preact/hooks";
import { ApiError, request } from "../api.ts";
import { sessionProblem } from "../live.ts";
import { connectedCount, memoryChanged } from "../state.ts";
import type { Memory as MemoryState } from "../types.ts";

function problemOf(err: unknown, what: string): string | undefined {
  if ((err as Error)?.name === "AbortError" || sessionProblem(err)) return undefined;
  if (err instanceof ApiError && err.status === 0) return "The server cannot be reached. Try again in a moment.";
  if (err instanceof ApiError && err.code === "INVALID_MEMORY") return err.message;
  if (err instanceof ApiError && err.code === "MEMORY_NOT_ENABLED") return "This device's assistant does not remember anything.";
  return what;
}

function when(ms: number): string {
  return new Date(ms).toLocaleString(undefined, { dateStyle: "medium", timeStyle: "short" });
}

function length(text: string): number {
  return Array.from(text).length;
}

/**
 * What the device's assistant remembers of its people: the text and when it changed, an edit, a
 * forget that asks first, and the switch that turns remembering off for this device.
 */
export function Memory({ bearer }: { bearer: string }) {
  const memory = useSignal<MemoryState | undefined>(undefined);
  const mode = useSignal<"view" | "edit" | "confirm">("view");
  const draft = useSignal("");
  const problem = useSignal<string | undefined>(undefined);
  const busy = useSignal(false);
  const reloads = useSignal(0);
  const reconnects = connectedCount.value;
  const changes = memoryChanged.value;

  useEffect(() => {
    const abort = new AbortController();
    request<MemoryState>("GET", "/side-control/memory", { bearer, signal: abort.signal }).then(
      (m) => {
        memory.value = m;
      },
      (err: unknown) => {
        const p = problemOf(err, "What the device remembers could not be loaded.");
        if (p) problem.value = p;
      },
    );
    return () => abort.abort();
  }, [bearer, reconnects, changes, reloads.value]);

  const change = async (body: { text?: string; enabled?: boolean }, then?: () => void) => {
    busy.value = true;
    try {
      memory.value = await request<MemoryState>("PUT", "/side-control/memory", { bearer, body });
      problem.value = undefined;
      then?.();
    } catch (err) {
      problem.value = problemOf(err, "The change could not be saved. Try again.");
    } finally {
      busy.value = false;
    }
  };
  const forget = async () => {
    busy.value = true;
    try {
      await request("DELETE", "/side-control/memory", { bearer });
      problem.value = undefined;
      mode.value = "view";
      reloads.value++;
    } catch (err) {
      problem.value = problemOf(err, "It could not be forgotten. Try again.");
    } finally {
      busy.value = false;
    }
  };

  const m = memory.value;
  const remembers = m !== undefined && m.max_chars > 0;
  return (
    <section class="card memory" aria-labelledby="memory-heading">
      <h2 id="memory-heading">Memory</h2>
      {problem.value && (
        <p class="error" role="alert">
          {problem.value}
        </p>
      )}
      {m === undefined ? (
        <p class="muted">Loading…</p>
      ) : !remembers ? (
        <>
          <p class="memory-off">This device's assistant does not remember anything between conversations.</p>
          {m.text && (
            <>
              <p class="muted">It kept this earlier:</p>
              <p class="memory-text">{m.text}</p>
              {mode.value === "confirm" ? (
                <ForgetConfirm busy={busy.value} onKeep={() => (mode.value = "view")} onForget={forget} />
              ) : (
                <p>
                  <button type="button" class="secondary" disabled={busy.value} onClick={() => (mode.value = "confirm")}>
                    Forget…
                  </button>
                </p>
              )}
            </>
          )}
        </>
      ) : (
        <>
          <div class="switch-row">
            <input
              id="memory-enabled"
              type="checkbox"
              role="switch"
              checked={m.enabled}
              aria-checked={m.enabled}
              disabled={busy.value}
              onChange={(e) => void change({ enabled: (e.target as HTMLInputElement).checked })}
            />
            <label for="memory-enabled">Remember between conversations</label>
          </div>
          {!m.enabled && <p class="muted">Remembering is off: nothing is kept after conversations and nothing is given to the assistant.</p>}
          {mode.value === "edit" ? (
            <form
              onSubmit={(e) => {
                e.preventDefault();
                void change({ text: draft.value }, () => (mode.value = "view"));
              }}
              aria-label="Edit what the device remembers"
            >
              <label for="memory-draft">What the device remembers</label>
              <textarea
                id="memory-draft"
                rows={6}
                value={draft.value}
                maxLength={m.max_chars * 2}
                aria-describedby="memory-count"
                onInput={(e) => (draft.value = (e.target as HTMLTextAreaElement).value)}
              />
              <p id="memory-count" class={length(draft.value) > m.max_chars ? "error" : "muted"}>
                {length(draft.value)} of {m.max_chars} characters
              </p>
              <div class="actions">
                <button type="submit" disabled={busy.value || length(draft.value) > m.max_chars}>
                  Save
                </button>
                <button type="button" class="secondary" onClick={() => (mode.value = "view")}>
                  Cancel
                </button>
              </div>
            </form>
          ) : (
            <>
              {m.text ? (
                <p class="memory-text">{m.text}</p>
              ) : (
                <p class="muted">Nothing remembered yet. After a conversation, what the assistant learnt about you appears here.</p>
              )}
              {m.updated_at_unix_ms !== undefined && <p class="muted">Changed {when(m.updated_at_unix_ms)}</p>}
              {mode.value === "confirm" ? (
                <ForgetConfirm busy={busy.value} onKeep={() => (mode.value = "view")} onForget={forget} />
              ) : (
                <div class="actions">
                  <button
                    type="button"
                    class="secondary"
                    disabled={busy.value}
                    onClick={() => {
                      draft.value = m.text;
                      mode.value = "edit";
                    }}
                  >
                    Edit
                  </button>
                  {m.text && (
                    <button type="button" class="secondary" disabled={busy.value} onClick={() => (mode.value = "confirm")}>
                      Forget…
                    </button>
                  )}
                </div>
              )}
            </>
          )}
        </>
      )}
    </section>
  );
}

function ForgetConfirm(p: { busy: boolean; onKeep(): void; onForget(): void }) {
  return (
    <fieldset class="confirm">
      <legend>Forget what the device remembers?</legend>
      <p class="muted">It is deleted for good and cannot be brought back.</p>
      <div class="actions">
        <button type="button" class="danger" disabled={p.busy} onClick={p.onForget}>
          Forget it
        </button>
        <button type="button" class="secondary" onClick={p.onKeep}>
          Keep it
        </button>
      </div>
    </fieldset>
  );
}
