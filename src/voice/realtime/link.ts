import WebSocket from "ws";
import type { VoiceClock } from "../clock.ts";
import { errorOf, parseServerEvent, type RealtimeServerEvent } from "./events.ts";

/**
 * Reconnection back-off (voice.md §6): at once, then 0.5 s doubling to 10 s; back to "at once" only
 * after a session has proved to work: it lived SESSION_PROVEN_MS, or answered a turn (`proven`).
 * Accepting the setup proves nothing (a provider may drop every session right after it).
 */
export const BACKOFF_FIRST_MS = 500;
export const BACKOFF_MAX_MS = 10_000;
export const SESSION_PROVEN_MS = 30_000;
/** At the longest step, a failure is said again (not `repeated`) once this many times. */
const REPEAT_SAY_EVERY = 6;
/** A provider's refusal body is read this far for its reason. */
const MAX_REASON_BYTES = 2048;
/**
 * Frames from the provider larger than this close the socket (an audio delta is a few KB; a tool
 * call's arguments are bounded far below, tools.md §2): parsing one costs the event loop ~30 ms.
 */
const MAX_PAYLOAD = 4 * 1024 * 1024;
/** Uplink audio is dropped while more than this waits to be written to a stalled socket. */
const MAX_BUFFERED = 1024 * 1024;

export interface LinkOptions {
  url: string;
  apiKey: string | undefined;
  /** The provider's `timeout_ms`: the handshake's limit. */
  timeoutMs: number;
  clock: VoiceClock;
  /** What opens every session: `session.update` (with `setupId` as its event id), then the history. */
  opening: (setupId: string) => Array<Record<string, unknown>>;
  /** Each server event of the open session (a rejected `session.update` is the link's own). */
  event: (e: RealtimeServerEvent) => void;
  /** A session opened (its setup sent). */
  up: () => void;
  /**
   * The session failed: the link is reconnecting (`retryInMs` from now). Called once per failure;
   * `repeated` when the back-off stayed at the step it was (worth a log line once per step only).
   */
  down: (reason: string, retryInMs: number, repeated: boolean) => void;
}

/**
 * One conversation's WebSocket to a realtime model, kept open: opened at once, its setup sent on
 * every (re)open, and reopened in the background with back-off after any failure (a refused
 * upgrade, a closed socket, a rejected setup, or one the session reports). Never throws.
 */
export class RealtimeLink {
  private readonly o: LinkOptions;
  private ws: WebSocket | undefined;
  private open_ = false;
  private closed = false;
  private failures = 0;
  /** Clock time the open session opened (undefined while none is open). */
  private openedAt: number | undefined;
  private lastDelay: number | undefined;
  private atMax = 0;
  private setupId = "";
  private sessions = 0;
  private cancelRetry: (() => void) | undefined;

  constructor(o: LinkOptions) {
    this.o = o;
    this.connect();
  }

  /** Whether a session is open (events sent now reach it). */
  get isOpen(): boolean {
    return this.open_;
  }

  /** Sends one client event; false when no session is open. `droppable` events (audio) are dropped while the socket is stalled. */
  send(event: Record<string, unknown>, droppable = false): boolean {
    const ws = this.ws;
    if (!this.open_ || !ws || ws.readyState !== WebSocket.OPEN) return false;
    if (droppable && ws.bufferedAmount > MAX_BUFFERED) return false;
    ws.send(JSON.stringify(event));
    return true;
  }

  /** The open session answered a turn: it works, and the next failure reconnects at once. */
  proven(): void {
    if (this.open_) this.reset();
  }

  /** Ends the session as failed (an error event, a model that never answered): reconnects with back-off. */
  fail(reason: string): void {
    if (this.closed) return;
    const ws = this.ws;
    this.ws = undefined;
    this.open_ = false;
    if (ws) {
      ws.removeAllListeners();
      ws.on("error", () => {});
      ws.terminate();
    }
    if (this.openedAt !== undefined && this.o.clock.now() - this.openedAt >= SESSION_PROVEN_MS) this.reset();
    this.openedAt = undefined;
    const delay = this.failures === 0 ? 0 : Math.min(BACKOFF_MAX_MS, BACKOFF_FIRST_MS * 2 ** (this.failures - 1));
    this.failures++;
    let repeated = delay === this.lastDelay;
    if (repeated && delay === BACKOFF_MAX_MS && ++this.atMax % REPEAT_SAY_EVERY === 0) repeated = false;
    if (!repeated) this.atMax = 0;
    this.lastDelay = delay;
    this.o.down(this.redact(reason), delay, repeated);
    this.cancelRetry = this.o.clock.after(delay, () => {
      this.cancelRetry = undefined;
      this.connect();
    });
  }

  /** Opens a new session now, the old one closed without a failure (a session near the end of its age, between turns). */
  renew(): void {
    if (this.closed || !this.open_) return;
    const ws = this.ws;
    this.ws = undefined;
    this.open_ = false;
    // A session that reached its age worked.
    this.reset();
    this.openedAt = undefined;
    if (ws) {
      ws.removeAllListeners();
      ws.on("error", () => {});
      ws.close(1000);
    }
    this.connect();
  }

  close(): void {
    if (this.closed) return;
    this.closed = true;
    this.open_ = false;
    this.cancelRetry?.();
    const ws = this.ws;
    this.ws = undefined;
    if (ws) {
      ws.removeAllListeners();
      ws.on("error", () => {});
      if (ws.readyState === WebSocket.OPEN) ws.close(1000);
      else ws.terminate();
    }
  }

  private reset(): void {
    this.failures = 0;
    this.lastDelay = undefined;
  }

  private redact(reason: string): string {
    const key = this.o.apiKey;
    return key ? reason.split(key).join("[key]") : reason;
  }

  private connect(): void {
    if (this.closed) return;
    let ws: WebSocket;
    try {
      ws = new WebSocket(this.o.url, {
        headers: this.o.apiKey ? { Authorization: `Bearer ${this.o.apiKey}` } : {},
        handshakeTimeout: this.o.timeoutMs,
        maxPayload: MAX_PAYLOAD,
        perMessageDeflate: false,
      });
    } catch (err) {
      this.fail((err as Error).message);
      return;
    }
    this.ws = ws;
    const current = () => this.ws === ws && !this.closed;
    ws.on("open", () => {
      if (!current()) return;
      this.sessions++;
      this.setupId = `perch_setup_${this.sessions}`;
      this.open_ = true;
      this.openedAt = this.o.clock.now();
      try {
        for (const e of this.o.opening(this.setupId)) ws.send(JSON.stringify(e));
        this.o.up();
      } catch (err) {
        this.fail(`the session could not be set up: ${(err as Error).message}`);
      }
    });
    ws.on("unexpected-response", (_req, res) => {
      const chunks: Buffer[] = [];
      let size = 0;
      const done = () => {
        if (!current()) return;
        const body = Buffer.concat(chunks).toString("utf8");
        let message = body.trim().slice(0, 300);
        try {
          const parsed = JSON.parse(body) as { error?: { message?: unknown } };
          if (typeof parsed.error?.message === "string") message = parsed.error.message;
        } catch {}
        this.fail(`the provider refused the connection: HTTP ${res.statusCode}${message ? ` (${message})` : ""}`);
      };
      res.on("data", (c: Buffer) => {
        if (size < MAX_REASON_BYTES) chunks.push(c);
        size += c.length;
        if (size >= MAX_REASON_BYTES) res.destroy();
      });
      res.on("end", done);
      res.on("close", done);
      res.on("error", done);
    });
    ws.on("message", (data, isBinary) => {
      if (!current() || isBinary) return;
      const e = parseServerEvent(data.toString());
      if (!e) return;
      if (e.type === "error" && errorOf(e).eventId === this.setupId) {
        this.fail(`the provider rejected session.update: ${errorOf(e).message}`);
        return;
      }
      this.o.event(e);
    });
    ws.on("error", (err) => {
      if (current()) this.fail(err.message);
    });
    ws.on("close", (code, reason) => {
      if (current()) this.fail(`the provider closed the session (${code}${reason.length ? ` ${reason.toString().slice(0, 200)}` : ""})`);
    });
  }
}
