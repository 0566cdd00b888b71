import { useSignal } from "@preact/signals";
import { useEffect } from "preact/hooks";
import { ApiError, request } from "../api.ts";
import { sessionProblem } from "../live.ts";
import { connectedCount, info, liveConversation } from "../state.ts";
import type { ConversationEntry, ConversationList, StoredConversation } from "../types.ts";
import { TurnDetails } from "./Turn.tsx";

const PAGE = 10;

function time(ms: number): string {
  return new Date(ms).toLocaleString(undefined, { dateStyle: "medium", timeStyle: "short" });
}

function problemOf(err: unknown, what: string): string | undefined {
  if ((err as Error)?.name === "AbortError" || sessionProblem(err)) return undefined;
  if (err instanceof ApiError && err.status === 0) return "The server cannot be reached. Try again in a moment.";
  return what;
}

/** One entry: the person's words and the device's as bubbles (a cut-off reply marked), a tool call as a small note. */
function Entry({ e, device }: { e: ConversationEntry; device: string }) {
  if (e.role === "tool") {
    return (
      <li class={`chat-note${e.tool?.is_error ? " failed" : ""}`}>
        <span class="chat-who">{e.tool?.is_error ? "Tool failed" : "Tool"}</span> {e.tool?.name ?? "tool"}
        {e.text ? `: ${e.text}` : ""}
      </li>
    );
  }
  const user = e.role === "user";
  return (
    <li class={`bubble ${user ? "from-user" : "from-device"}`}>
      <span class="chat-who">{user ? "Heard" : `${device} said`}</span>
      <span class="chat-text">{e.text}</span>
      {e.interrupted && <span class="chat-tag">interrupted</span>}
    </li>
  );
}

function Chat({ entries, label }: { entries: ConversationEntry[]; label: string }) {
  const device = info.value.name || "Device";
  return (
    <ol class="chat" aria-label={label}>
      {entries.map((e, i) => (
        <Entry key={`${e.conversation_id}:${i}`} e={e} device={device} />
      ))}
    </ol>
  );
}

/** A stored conversation's entries, each turn followed by what happened in it: its two sides to play and its timeline. */
function StoredChat({ c, label, path, bearer }: { c: StoredConversation; label: string; path: string; bearer: string }) {
  const device = info.value.name || "Device";
  const turns = new Map<number, ConversationEntry[]>();
  for (const e of c.items) turns.set(e.turn, [...(turns.get(e.turn) ?? []), e]);
  return (
    <ol class="chat" aria-label={label}>
      {[...turns].map(([turn, entries]) => [
        ...entries.map((e, i) => <Entry key={`${turn}:${i}`} e={e} device={device} />),
        <TurnDetails
          key={`${turn}:details`}
          turn={turn}
          entries={entries}
          recordings={(c.recordings ?? []).filter((r) => r.turn === turn)}
          path={path}
          bearer={bearer}
        />,
      ])}
    </ol>
  );
}

/** A stored conversation: its summary, its entries on demand, and a delete that asks first. */
function Stored({ c, bearer, onDeleted }: { c: ConversationList["items"][number]; bearer: string; onDeleted(): void }) {
  const entries = useSignal<StoredConversation | undefined>(undefined);
  const open = useSignal(false);
  const confirming = useSignal(false);
  const problem = useSignal<string | undefined>(undefined);
  const path = `/side-control/conversations/${encodeURIComponent(c.id)}`;
  const when = time(c.started_at_unix_ms);
  const toggle = async () => {
    open.value = !open.value;
    if (!open.value || entries.value) return;
    try {
      entries.value = await request<StoredConversation>("GET", path, { bearer });
      problem.value = undefined;
    } catch (err) {
      problem.value = problemOf(err, "This conversation could not be loaded.");
    }
  };
  const remove = async () => {
    try {
      await request("DELETE", path, { bearer });
      onDeleted();
    } catch (err) {
      confirming.value = false;
      if (err instanceof ApiError && err.code === "CONVERSATION_NOT_FOUND") onDeleted();
      else problem.value = problemOf(err, "The conversation could not be deleted.");
    }
  };
  return (
    <li class="conversation">
      <div class="conversation-head">
        <div>
          <p class="conversation-when">{when}</p>
          <p class="muted conversation-last">
            {c.turns} {c.turns === 1 ? "turn" : "turns"} · {c.first_question ? `“${c.first_question}”` : c.last_text}
          </p>
        </div>
        {confirming.value ? (
          <div class="actions">
            <button type="button" class="danger" onClick={remove}>
              Delete conversation of {when}
            </button>
            <button type="button" class="secondary" onClick={() => (confirming.value = false)}>
              Keep
            </button>
          </div>
        ) : (
          <div class="actions">
            <button
              type="button"
              class="secondary"
              aria-expanded={open.value ? "true" : "false"}
              onClick={toggle}
              aria-label={`${open.value ? "Hide" : "Show"} conversation of ${when}`}
            >
              {open.value ? "Hide" : "Show"}
            </button>
            <button type="button" class="secondary" onClick={() => (confirming.value = true)} aria-label={`Delete conversation of ${when}`}>
              Delete
            </button>
          </div>
        )}
      </div>
      {problem.value && (
        <p class="error" role="alert">
          {problem.value}
        </p>
      )}
      {open.value && entries.value && <StoredChat c={entries.value} label={`Conversation of ${when}`} path={path} bearer={bearer} />}
    </li>
  );
}

/** Earlier conversations when the server stores them: pages newest first, each deletable, and a delete-all that asks first. */
function Earlier({ bearer }: { bearer: string }) {
  const page = useSignal<ConversationList | undefined>(undefined);
  const cursors = useSignal<Array<string | undefined>>([undefined]);
  const problem = useSignal<string | undefined>(undefined);
  const reloads = useSignal(0);
  const confirmingAll = useSignal(false);
  const cursor = cursors.value.at(-1);
  const reconnects = connectedCount.value;
  // A new live conversation means the one before it is complete in the store.
  const liveId = liveConversation.value[0]?.conversation_id;

  useEffect(() => {
    const abort = new AbortController();
    const q = new URLSearchParams({ limit: String(PAGE) });
    if (cursor) q.set("cursor", cursor);
    request<ConversationList>("GET", `/side-control/conversations?${q}`, { bearer, signal: abort.signal }).then(
      (list) => {
        problem.value = undefined;
        if (list.items.length === 0 && cursors.value.length > 1) cursors.value = cursors.value.slice(0, -1);
        else page.value = list;
      },
      (err: unknown) => {
        problem.value = problemOf(err, "Earlier conversations could not be loaded.");
      },
    );
    return () => abort.abort();
  }, [bearer, cursor, reconnects, liveId, reloads.value]);

  const reload = () => reloads.value++;
  const deleteAll = async () => {
    try {
      await request("DELETE", "/side-control/conversations", { bearer });
      confirmingAll.value = false;
      cursors.value = [undefined];
      reload();
    } catch (err) {
      confirmingAll.value = false;
      problem.value = problemOf(err, "The conversations could not be deleted.");
    }
  };
  const pageNumber = cursors.value.length;
  // The conversation going on now is shown above, not here.
  const list = page.value && { ...page.value, items: page.value.items.filter((c) => c.id !== liveId) };
  return (
    <>
      <h3 id="earlier-heading">Earlier</h3>
      {problem.value && (
        <p class="error" role="alert">
          {problem.value}
        </p>
      )}
      {list && !list.stored && <p class="muted">This server does not keep conversations: they appear here only while you watch.</p>}
      {list?.stored && list.items.length === 0 && pageNumber === 1 && <p class="muted">No stored conversations.</p>}
      {list?.stored && list.items.length > 0 && (
        <>
          <ul class="conversations" aria-labelledby="earlier-heading">
            {list.items.map((c) => (
              <Stored key={c.id} c={c} bearer={bearer} onDeleted={reload} />
            ))}
          </ul>
          {(pageNumber > 1 || list.has_next) && (
            <nav class="pager" aria-label="Conversation pages">
              <button type="button" class="secondary" disabled={pageNumber === 1} onClick={() => (cursors.value = cursors.value.slice(0, -1))}>
                Newer
              </button>
              <span class="muted">Page {pageNumber}</span>
              <button
                type="button"
                class="secondary"
                disabled={!list.has_next}
                onClick={() => {
                  if (list.next_cursor) cursors.value = [...cursors.value, list.next_cursor];
                }}
              >
                Older
              </button>
            </nav>
          )}
          {confirmingAll.value ? (
            <fieldset class="confirm">
              <legend>Delete every stored conversation?</legend>
              <p class="muted">Every stored conversation of this device will be deleted for good.</p>
              <div class="actions">
                <button type="button" class="danger" onClick={deleteAll}>
                  Delete all conversations
                </button>
                <button type="button" class="secondary" onClick={() => (confirmingAll.value = false)}>
                  Keep them
                </button>
              </div>
            </fieldset>
          ) : (
            <p>
              <button type="button" class="secondary" onClick={() => (confirmingAll.value = true)}>
                Delete all…
              </button>
            </p>
          )}
        </>
      )}
    </>
  );
}

/** The device's conversations: the one going on now, live, and the stored ones below. */
export function Conversations({ bearer }: { bearer: string }) {
  const live = liveConversation.value;
  return (
    <section class="card" aria-labelledby="conversations-heading">
      <h2 id="conversations-heading">Conversations</h2>
      <h3>Now</h3>
      <div aria-live="polite">
        {live.length === 0 ? (
          <p class="muted">Nothing said yet. What the device hears and says appears here as it happens.</p>
        ) : (
          <Chat entries={live} label="Live conversation" />
        )}
      </div>
      <Earlier bearer={bearer} />
    </section>
  );
}
