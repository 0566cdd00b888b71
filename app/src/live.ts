import { ApiError, request, type Session } from "./api.ts";
import {
  addConversationEntry,
  connectedCount,
  contactsChanged,
  emitTelemetry,
  endSession,
  info,
  link,
  memoryChanged,
  runtime,
  session,
  status,
  usageChanged,
} from "./state.ts";
import type { ConversationEntry, DeviceInfo, PeerStatus, Runtime, TelemetryValue, Usage } from "./types.ts";

const BACKOFF_MIN_MS = 1_000;
const BACKOFF_MAX_MS = 30_000;

/** After `attempt` failures: 1 s doubling to 30 s, with jitter, so that many phones do not return at once. */
function backoff(attempt: number): number {
  const base = Math.min(BACKOFF_MAX_MS, BACKOFF_MIN_MS * 2 ** attempt);
  return Math.round(base * (0.5 + Math.random() / 2));
}

/**
 * An API failure that means the pairing is over; the app then says why. A failure of a request made
 * with an earlier pairing's bearer (one a new link replaced) is over too, but ends nothing here.
 */
export function sessionProblem(err: unknown): boolean {
  if (!(err instanceof ApiError)) return false;
  if (err.bearer !== undefined && err.bearer !== session.value?.access_token) return err.status === 401;
  if (err.status === 401) endSession("invalid");
  else if (err.code === "PEER_BLOCKED") endSession("blocked");
  else return false;
  return true;
}

function dispatch(s: Session, event: string, data: unknown): void {
  switch (event) {
    case "status":
      status.value = data as PeerStatus;
      break;
    case "runtime":
      runtime.value = data as Runtime;
      break;
    case "telemetry":
      emitTelemetry((data as { values: TelemetryValue[] }).values);
      break;
    case "contacts":
      contactsChanged.value++;
      break;
    case "conversation":
      addConversationEntry(data as ConversationEntry);
      break;
    case "memory":
      memoryChanged.value++;
      break;
    case "usage":
      usageChanged.value = data as Usage;
      break;
    case "session":
      // The stream of a pairing a new link replaced says it ended: the new pairing goes on.
      if (session.value?.access_token !== s.access_token) break;
      endSession((data as { state: "revoked" | "expired" }).state === "expired" ? "expired" : "revoked");
      break;
  }
}

/** Parses server-sent events from a fetch body; resolves when the server ends the stream. */
async function read(s: Session, body: ReadableStream<Uint8Array>, signal: AbortSignal): Promise<void> {
  const reader = body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  signal.addEventListener("abort", () => reader.cancel().catch(() => {}));
  for (;;) {
    const { done, value } = await reader.read();
    if (done) return;
    buffer += decoder.decode(value, { stream: true });
    let at = buffer.indexOf("\n\n");
    while (at >= 0) {
      const block = buffer.slice(0, at);
      buffer = buffer.slice(at + 2);
      at = buffer.indexOf("\n\n");
      let event = "message";
      const data: string[] = [];
      for (const line of block.split("\n")) {
        if (line.startsWith("event:")) event = line.slice(6).trim();
        else if (line.startsWith("data:")) data.push(line.slice(5).trimStart());
      }
      if (data.length === 0) continue;
      try {
        dispatch(s, event, JSON.parse(data.join("\n")));
      } catch {
        // A malformed event is skipped.
      }
    }
  }
}

/**
 * Keeps the device's state live: the event stream (re)opened with back-off whenever it ends
 * without the session ending (the server restarting, the network dropping), and on each
 * (re)connect the state read again (status and runtime come first on the stream; the device's
 * info here; the views re-read theirs on `connectedCount`). Returns the function that stops it.
 */
export function startLive(s: Session): () => void {
  const abort = new AbortController();
  let attempt = 0;
  const wait = (ms: number) => new Promise<void>((resolve) => setTimeout(resolve, ms));
  const run = async () => {
    while (!abort.signal.aborted) {
      let reason = "the server cannot be reached";
      try {
        link.value = { state: "connecting" };
        const res = await fetch("/side-control/events", { headers: { authorization: `Bearer ${s.access_token}` }, signal: abort.signal, cache: "no-store" });
        if (!res.ok || !res.body) {
          const err = await request("GET", "/side-control/status", { bearer: s.access_token, signal: abort.signal }).then(
            () => new ApiError(res.status, "HTTP_ERROR", `the event stream answered ${res.status}`),
            (e: unknown) => e,
          );
          if (sessionProblem(err)) return;
          reason = res.status === 429 ? "too many open streams for this pairing" : `the server answered ${res.status}`;
          throw err;
        }
        attempt = 0;
        link.value = { state: "live" };
        connectedCount.value++;
        request<DeviceInfo>("GET", "/side-control/info", { bearer: s.access_token, signal: abort.signal }).then(
          (i) => (info.value = i),
          (err: unknown) => sessionProblem(err),
        );
        await read(s, res.body, abort.signal);
        reason = "the server closed the stream";
      } catch (err) {
        if (abort.signal.aborted) return;
        if (err instanceof ApiError && err.status === 0) reason = "the server cannot be reached";
      }
      if (abort.signal.aborted) return;
      const delay = backoff(attempt++);
      link.value = { state: "retrying", retryAt: Date.now() + delay, reason };
      await wait(delay);
    }
  };
  run().catch(() => {});
  return () => abort.abort();
}
