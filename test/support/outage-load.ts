import { generateKeyPair } from "../../src/crypto/keys.ts";
import { PerchClient } from "../../src/sdk/client.ts";

/** One request as a client saw it. `status` 0: no answer (connection refused or reset, or no answer within the timeout). */
export interface Outcome {
  at: number;
  node: number;
  kind: Kind;
  status: number;
  ms: number;
  retryAfter: string | null;
  /** The error envelope's code (`ErrorResponse.error.code`, or OpenAI's `error.type`), for non-2xx answers. */
  code: string | undefined;
  /** For a contact create answered 201: the name stored. */
  created?: string;
}

export type Kind = "contact" | "status_put" | "status_get" | "openai_models" | "healthz" | "readyz";
const KINDS: Kind[] = ["contact", "status_put", "status_get", "openai_models", "healthz", "readyz"];

interface Device {
  node: number;
  base: string;
  primary: string;
  sideControl: string;
}

/**
 * Clients on every node, each in a loop over requests that need the store (a contact create per
 * round, every create's name unique), plus the liveness and readiness checks; records every outcome.
 */
export class OutageLoad {
  readonly outcomes: Outcome[] = [];
  private stopped = false;
  private readonly loops: Promise<void>[] = [];
  private readonly t0 = Date.now();
  private readonly devices: Device[];
  private readonly timeoutMs: number;

  private constructor(devices: Device[], timeoutMs: number) {
    this.devices = devices;
    this.timeoutMs = timeoutMs;
  }

  /** Logs in `perNode` devices on each node (a primary and a Side Control session each) and starts their loops. */
  static async start(urls: string[], o: { perNode?: number; timeoutMs?: number } = {}): Promise<OutageLoad> {
    const devices: Device[] = [];
    for (const [node, base] of urls.entries()) {
      for (let i = 0; i < (o.perNode ?? 4); i++) {
        const device = new PerchClient({ baseUrl: base, keyPair: generateKeyPair() });
        await device.login({ assertion: await device.assertion() });
        const token = await device.createDeviceToken();
        const phone = new PerchClient({ baseUrl: base, keyPair: generateKeyPair() });
        await phone.login({ deviceToken: token.token });
        devices.push({ node, base, primary: device.accessToken!, sideControl: phone.accessToken! });
      }
    }
    const load = new OutageLoad(devices, o.timeoutMs ?? 10_000);
    for (const [i, d] of devices.entries()) load.loops.push(load.loop(d, i));
    return load;
  }

  /** Seconds since the load started. */
  now(): number {
    return (Date.now() - this.t0) / 1000;
  }

  async stop(): Promise<Outcome[]> {
    this.stopped = true;
    await Promise.all(this.loops);
    return this.outcomes;
  }

  /** Every contact name a 201 acknowledged, with the Side Control bearer that can read it back. */
  acknowledged(): Array<{ base: string; bearer: string; name: string }> {
    return this.outcomes.filter((o) => o.created).map((o) => ({ ...this.byNode(o), name: o.created! }));
  }

  private byNode(o: Outcome): { base: string; bearer: string } {
    const d = this.devices.find((d) => d.node === o.node)!;
    return { base: d.base, bearer: d.sideControl };
  }

  private async loop(d: Device, worker: number): Promise<void> {
    let round = 0;
    while (!this.stopped) {
      for (const kind of KINDS) {
        if (this.stopped) return;
        await this.one(d, kind, `w${worker}-${round}`);
      }
      round++;
    }
  }

  private async one(d: Device, kind: Kind, name: string): Promise<void> {
    const started = Date.now();
    const req = {
      contact: () => ["POST", "/side-control/contacts", d.sideControl, { name, display_name: name }] as const,
      status_put: () => ["PUT", "/me/status", d.primary, { volume: Number(name.split("-")[1]) % 101 }] as const,
      status_get: () => ["GET", "/me/status", d.primary, undefined] as const,
      openai_models: () => ["GET", "/openai/v1/models", d.primary, undefined] as const,
      healthz: () => ["GET", "/healthz", undefined, undefined] as const,
      readyz: () => ["GET", "/readyz", undefined, undefined] as const,
    }[kind]();
    const [method, path, bearer, body] = req;
    let status = 0;
    let retryAfter: string | null = null;
    let code: string | undefined;
    try {
      const res = await fetch(d.base + path, {
        method,
        headers: { ...(bearer ? { authorization: `Bearer ${bearer}` } : {}), ...(body ? { "content-type": "application/json" } : {}) },
        body: body ? JSON.stringify(body) : null,
        signal: AbortSignal.timeout(this.timeoutMs),
      });
      status = res.status;
      retryAfter = res.headers.get("retry-after");
      const text = await res.text();
      if (status >= 300) {
        try {
          const e = JSON.parse(text).error;
          code = path.startsWith("/openai/") ? e?.type : e?.code;
        } catch {
          code = "not-json";
        }
      }
    } catch {
      status = 0;
      // No answer: wait a moment, as a client would, rather than spin on a refused port.
      await new Promise((r) => setTimeout(r, 100));
    }
    this.outcomes.push({
      at: (started - this.t0) / 1000,
      node: d.node,
      kind,
      status,
      ms: Date.now() - started,
      retryAfter,
      code,
      ...(kind === "contact" && status === 201 ? { created: name } : {}),
    });
  }
}

/** Outcomes in [from, to) seconds, summarised: counts by kind and status (with the envelope's code), the slowest, and the span of failures. */
export function summarise(outcomes: Outcome[], from = 0, to = Number.POSITIVE_INFINITY) {
  const within = outcomes.filter((o) => o.at >= from && o.at < to);
  const byStatus: Record<string, number> = {};
  for (const o of within) {
    const key = `${o.kind} ${o.status}${o.code ? ` ${o.code}` : ""}${o.status === 503 ? (o.retryAfter ? " +Retry-After" : " no-Retry-After") : ""}`;
    byStatus[key] = (byStatus[key] ?? 0) + 1;
  }
  const failing = within.filter((o) => o.status === 0 || o.status >= 500);
  const first = failing.length ? Math.min(...failing.map((o) => o.at)) : undefined;
  const last = failing.length ? Math.max(...failing.map((o) => o.at + o.ms / 1000)) : undefined;
  return {
    requests: within.length,
    by_status: Object.fromEntries(Object.entries(byStatus).sort()),
    slowest_ms: within.reduce((m, o) => Math.max(m, o.ms), 0),
    failures: failing.length,
    failing_from_s: first === undefined ? null : Number((first - from).toFixed(2)),
    failing_until_s: last === undefined ? null : Number((last - from).toFixed(2)),
  };
}
