import { signal } from "@preact/signals";
import { forgetSession, type Session, storedSession } from "./api.ts";
import type { ConversationEntry, DeviceInfo, PeerStatus, Runtime, TelemetryValue, Usage } from "./types.ts";

/** Why the app is not (or no longer) paired, in words for the person holding the phone. */
export type Ended = "revoked" | "expired" | "invalid" | "blocked";

export const session = signal<Session | undefined>(storedSession());
export const ended = signal<Ended | undefined>(undefined);
/** A pairing link's token waits to be tried (once: a used token is never sent again). */
export const linkPending = signal(false);
/** Why a pairing link opened on a phone that was already paired was not used (the pairing it had is kept). */
export const linkNotice = signal<string | undefined>(undefined);
/** The event stream: `live`, or being (re)made; `retryAt` is when the next attempt starts. */
export const link = signal<{ state: "connecting" | "live" | "retrying"; retryAt?: number; reason?: string }>({ state: "connecting" });
export const info = signal<DeviceInfo>({});
export const status = signal<PeerStatus>({});
export const runtime = signal<Runtime>({ online: false });
/** Bumped on every (re)connect of the stream and every contacts event: views re-read then. */
export const connectedCount = signal(0);
export const contactsChanged = signal(0);
/** Bumped on every `memory` event: the Memory section reads it again. */
export const memoryChanged = signal(0);
/** The device's usage as the last `usage` event told it (a limit reached or reset); the Today section reads it again. */
export const usageChanged = signal<Usage | undefined>(undefined);
/** The device's conversation while the app watches: the entries of its newest conversation (the last 200). */
export const liveConversation = signal<ConversationEntry[]>([]);
const LIVE_ENTRIES = 200;

export function addConversationEntry(e: ConversationEntry): void {
  const current = liveConversation.value;
  // A new conversation (the device connected again) replaces the one shown; the earlier one is in the stored list.
  const same = current.length > 0 && current[0]!.conversation_id === e.conversation_id;
  liveConversation.value = same ? [...current, e].slice(-LIVE_ENTRIES) : [e];
}

type TelemetryListener = (values: TelemetryValue[]) => void;
const telemetryListeners = new Set<TelemetryListener>();

export function onTelemetry(fn: TelemetryListener): () => void {
  telemetryListeners.add(fn);
  return () => telemetryListeners.delete(fn);
}

export function emitTelemetry(values: TelemetryValue[]): void {
  for (const fn of telemetryListeners) fn(values);
}

/** The pairing is over: the stored bearer is dropped and the page offers to pair again. */
export function endSession(why: Ended): void {
  forgetSession();
  ended.value = why;
  session.value = undefined;
  info.value = {};
  status.value = {};
  runtime.value = { online: false };
}
