import type { Config } from "../config/config.ts";
import type { Store } from "../store/index.ts";
import type { UsageDelta, UsageRow } from "../store/usage.ts";
import type { Clock } from "./clock.ts";
import { DomainError } from "./errors.ts";
import {
  ALL_DEVICES,
  addCounts,
  COUNT_FIELDS,
  type Counts,
  counterValue,
  dayOf,
  expandLimits,
  inLimit,
  type Limit,
  type LimitCounter,
  monthStart,
  parseDeviceLimits,
  resetsAt,
  zeroCounts,
} from "./usage-limits.ts";

/** How old a node's view of the store's counts (and of a device's own limits) may be before it is read again. */
const VIEW_MS = 1_000;
/** After work ends its counts are written within this (several ends share one transaction). */
const END_FLUSH_MS = 20;
/** Request units one claim takes at most (the rest of the limit shared out, never more than there is). */
const MAX_LEASE = 1024;
/** Unused request units go back to the store once their claim has been idle this long (or when the node closes). */
const LEASE_IDLE_MS = 10_000;

export interface Who {
  /** `device:<key>` or `api_key:<name>`. */
  id: string;
  /** The device's key, for a device. */
  device?: string;
  /** The API key's name, for an application. */
  apiKey?: string;
}

/** What one piece of work adds (besides its request, counted by `answered`). */
export type UsageAdd = Partial<Counts> & { estimated?: boolean };

/** A limit reached: the work is refused. `retryAfter` seconds to the reset. */
export class UsageLimited extends DomainError {
  readonly limit: Limit;
  readonly resetsAt: number;

  constructor(limit: Limit, resets: number, now: number) {
    const what = `${limit.per === "day" ? "daily" : "monthly"} ${limit.counter} limit (${limit.value}${limit.agent ? ` for ${limit.agent}` : ""})`;
    const scope = limit.scope === "all_devices" ? "all devices'" : limit.scope === "api_key" ? "this API key's" : "this device's";
    super(
      "rate_limited",
      "INSUFFICIENT_QUOTA",
      `You exceeded ${scope} ${what}; it resets at ${new Date(resets).toISOString()}.`,
      { counter: limit.counter, scope: limit.scope, per: limit.per, resets_at_unix_ms: resets },
      Math.max(1, Math.ceil((resets - now) / 1000)),
    );
    this.limit = limit;
    this.resetsAt = resets;
  }
}

/** One piece of work admitted: its counts, and whether it was answered (its request counted) or not. */
export interface Admission {
  /** Adds counts of the work as it goes (tokens, characters, audio, tool calls). */
  add(counts: UsageAdd): void;
  /** The work was answered: its request counts. Once; later calls do nothing. */
  answered(): void;
  /** The work was not answered (it failed, its client left): no request counts. */
  abandon(): void;
}

export interface MeterHooks {
  /** Counts added (for `perch_usage_total`). */
  counted?: (agent: string, counts: UsageAdd) => void;
  /** Work refused by a limit (for `perch_usage_limited_total`). */
  refused?: (limit: Limit) => void;
  /** A device's work was refused while it was not known limited, or the limit it was refused by reset. */
  deviceLimited?: (key: string) => void;
  /** A store error while counting (logged and counted; the work goes on). */
  storeError?: (err: unknown) => void;
}

interface OwnLimits {
  limits: Limit[] | undefined;
  readAt: number;
  reading?: Promise<void>;
  /** The limits that apply (own or configured, and every device's), made once per read. */
  resolved?: Limit[];
}

interface View {
  /** The principal's rows of this month, as last read (plus what this node wrote since). */
  rows: Map<string, Counts>;
  month: string;
  readAt: number;
}

interface Lease {
  day: string;
  /** Request units claimed in the store and not handed out. */
  free: number;
  claiming: Promise<void> | undefined;
  /** The last claim's size (a claim for more starts in the background when a quarter is left). */
  took: number;
  /** When a unit was last handed out (units idle for LEASE_IDLE_MS go back to the store). */
  usedAt: number;
}

/**
 * Counting and limits on one node (usage.md §1–2). Counts gather in memory per (principal, day,
 * agent) and reach the store at least once a second and soon after each piece of work ends, each
 * row with one adding statement. Limits are judged on a view of the store's counts at most a second
 * old plus what this node has not written yet. Requests under a request limit are claimed in the
 * store before work starts (a few at a time, under a lock per principal, never beyond the limit),
 * so racing nodes never answer more than the limit; the other counters are only known once work
 * ends, so near such a limit a node lets one piece start at a time (see docs/decisions.md).
 */
export class UsageMeter {
  private readonly store: Store;
  private readonly clock: Clock;
  private readonly config: Config;
  private hooks: MeterHooks = {};
  /** Counts not written yet: principal → `day\0agent` → counts (and the rows marked estimated). */
  private pending = new Map<string, Map<string, Counts>>();
  private estimated = new Set<string>();
  /** Counts being written now. */
  private flushing: Map<string, Map<string, Counts>> | undefined;
  private readonly views = new Map<string, View>();
  private readonly viewReads = new Map<string, Promise<void>>();
  /** Devices' own limits (undefined: none, the configured ones apply), as last read. */
  private readonly own = new Map<string, OwnLimits>();
  /** Each API key's limits. */
  private readonly keyLimits = new Map<string, Limit[]>();
  /** Each set of limits split for one agent: the request limits (claimed) and the others. */
  private readonly plans = new WeakMap<Limit[], Map<string, { others: Limit[]; requests: Limit[] }>>();
  private today = { from: 0, to: 0, day: "" };
  private readonly leases = new Map<string, Lease>();
  /** Pieces of work in flight per principal (for the one-at-a-time rule near a limit). */
  private readonly inFlight = new Map<string, number>();
  /** Work waiting for a principal's flight to land (near a limit), woken as each piece ends. */
  private readonly landing = new Map<string, Array<() => void>>();
  /** The largest piece seen per principal and counter. */
  private readonly largest = new Map<string, number>();
  /** Devices known limited, with the timer that tells of their reset. */
  private readonly limitedDevices = new Map<string, NodeJS.Timeout>();
  private readonly configured: { device: Limit[]; all: Limit[]; apiKey: Limit[]; keys: Map<string, Limit[]> };
  /** Transactions of the meter run one at a time. */
  private queue: Promise<unknown> = Promise.resolve();
  private endTimer: NodeJS.Timeout | undefined;
  private closed = false;
  /** `usage.count`: false, nothing is counted (and the configuration has no limits). */
  private readonly counting: boolean;

  constructor(o: { store: Store; clock: Clock; config: Config }) {
    this.counting = o.config.usage.count;
    this.store = o.store;
    this.clock = o.clock;
    this.config = o.config;
    const { limits } = o.config.usage;
    this.configured = {
      device: expandLimits(
        limits.filter((l) => l.scope === "device"),
        "device",
        "",
      ),
      all: expandLimits(
        limits.filter((l) => l.scope === "all_devices"),
        "all_devices",
        ALL_DEVICES,
      ),
      apiKey: expandLimits(
        limits.filter((l) => l.scope === "api_key"),
        "api_key",
        "",
      ),
      keys: new Map(o.config.api_keys.map((k) => [k.name, expandLimits(k.limits, "api_key", "")])),
    };
  }

  /** Who hears of counts, refusals and store errors (the node's metrics and log). */
  setHooks(hooks: MeterHooks): void {
    this.hooks = hooks;
  }

  /** This node's counts of `principal` not written yet, of `day` or of the month of `day`. */
  unwritten(principal: string, fromDay: string): Array<{ day: string; agent: string; counts: Counts }> {
    const out: Array<{ day: string; agent: string; counts: Counts }> = [];
    for (const source of [this.pending, this.flushing]) {
      for (const [k, c] of source?.get(principal) ?? []) {
        const day = k.slice(0, 10);
        if (day >= fromDay) out.push({ day, agent: k.slice(11), counts: c });
      }
    }
    return out;
  }

  /** Request units of `principal` this node claimed and has not handed out (in the store's count already). */
  unusedUnits(principal: string, fromDay: string): number {
    let n = 0;
    for (const [k, lease] of this.leases) if (lease.day >= fromDay && k.startsWith(`${principal}\0`)) n += lease.free;
    return n;
  }

  /** Whether this node refused a device's work and its limit has not reset. */
  knownLimited(key: string): boolean {
    return this.limitedDevices.has(key);
  }

  /**
   * Whether a limit of `who`'s use of `agent` is reached as far as this node knows now, without
   * waiting for the store (a voice turn's reply prepared in a pause is not asked then): its limits
   * and counts as last read, and what it counted since.
   */
  limitedCached(who: Who, agent: string): boolean {
    if (!this.counting) return false;
    if (who.device !== undefined && this.limitedDevices.has(who.device)) return true;
    const own = who.device !== undefined ? this.own.get(who.device) : undefined;
    const limits = who.device !== undefined ? own && this.resolved(who.id, own) : this.limits(who);
    if (!limits || limits instanceof Promise) return false;
    const now = this.clock.now();
    for (const l of limits) {
      if (l.agent !== undefined && l.agent !== agent) continue;
      const free = l.counter === "requests" ? (this.leases.get(this.leaseKey(who, agent))?.free ?? 0) : 0;
      if (this.used(l, now) - free >= l.value) return true;
    }
    return false;
  }

  /** Writes what is left (leases given back) and stops. */
  async close(): Promise<void> {
    this.closed = true;
    for (const id of [...this.landing.keys()]) this.landed(id);
    if (this.endTimer) clearTimeout(this.endTimer);
    for (const t of this.limitedDevices.values()) clearTimeout(t);
    this.limitedDevices.clear();
    await this.flush("all").catch(() => {});
  }

  /** The limits that apply to `who` (undefined agent: all of them), reading a device's own limits when the node's copy is old. */
  limits(who: Who): Limit[] | Promise<Limit[]> {
    if (who.apiKey !== undefined) {
      let limits = this.keyLimits.get(who.apiKey);
      if (!limits) {
        const against = who.id;
        limits = [...this.configured.apiKey, ...(this.configured.keys.get(who.apiKey) ?? [])].map((l) => ({ ...l, against }));
        this.keyLimits.set(who.apiKey, limits);
      }
      return limits;
    }
    const key = who.device!;
    const entry = this.own.get(key);
    if (!entry) return this.readOwn(key).then(() => this.resolved(who.id, this.own.get(key)));
    if (!entry.reading && this.clock.now() - entry.readAt >= VIEW_MS) {
      // The copy answers now; the next check has the one read meanwhile.
      entry.reading = this.readOwn(key);
    }
    return this.resolved(who.id, entry);
  }

  private resolved(id: string, entry: OwnLimits | undefined): Limit[] {
    if (!entry) return this.deviceLimits(id, undefined);
    entry.resolved ??= this.deviceLimits(id, entry.limits);
    return entry.resolved;
  }

  private deviceLimits(id: string, own: Limit[] | undefined): Limit[] {
    const device = (own ?? this.configured.device).map((l) => ({ ...l, against: id }));
    return this.configured.all.length > 0 ? [...device, ...this.configured.all] : device;
  }

  private readOwn(key: string): Promise<void> {
    const read = this.store
      .read((r) => r.usage.deviceLimits([key]))
      .then(
        (found) => {
          const text = found.get(key);
          const parsed = text === undefined ? undefined : parseDeviceLimits(text);
          this.own.set(key, { limits: parsed && expandLimits(parsed, "device", ""), readAt: this.clock.now() });
        },
        (err: unknown) => {
          this.hooks.storeError?.(err);
          const old = this.own.get(key);
          this.own.set(key, { limits: old?.limits, readAt: this.clock.now() });
        },
      );
    return read;
  }

  /** Forgets a device's own limits as read (they were just changed here); `removed`: its counts not written yet too. */
  forgetDevice(key: string, removed = false): void {
    // Units claimed ahead under the old limits go back: the next request claims under the new ones.
    for (const [k, lease] of this.leases) {
      if (lease.free > 0 && k.startsWith(`device:${key}\0`)) this.giveBack({ id: `device:${key}`, device: key }, k.slice(k.indexOf("\0") + 1), lease);
    }
    this.own.delete(key);
    this.views.delete(`device:${key}`);
    if (!removed) return;
    this.pending.delete(`device:${key}`);
    // A write under way when the device was removed may have put its row back: removed again after it.
    this.serial(() => this.store.transaction((tx) => tx.usage.removePrincipal(`device:${key}`))).catch((err: unknown) => this.hooks.storeError?.(err));
  }

  /**
   * Admits a piece of work of `who` with `agent` (an agent or model id), or throws `UsageLimited`
   * naming the limit reached. Resolves at once when nothing limits `who`.
   */
  admit(who: Who, agent: string): Admission | Promise<Admission> {
    if (!this.counting) return UNCOUNTED;
    const limits = this.limits(who);
    if (limits instanceof Promise) return limits.then((l) => this.admitUnder(who, agent, l));
    return this.admitUnder(who, agent, limits);
  }

  private admitUnder(who: Who, agent: string, all: Limit[]): Admission | Promise<Admission> {
    const plan = this.plan(all, agent);
    if (plan.others.length === 0 && plan.requests.length === 0) return this.admission(who, agent, false);
    // Only the counters known after the work need the views; requests are claimed from the store itself.
    const stale = plan.others.length > 0 ? this.staleViews(plan.others) : undefined;
    if (stale) return stale.then(() => this.judge(who, agent, plan));
    return this.judge(who, agent, plan);
  }

  private plan(all: Limit[], agent: string): { others: Limit[]; requests: Limit[] } {
    let byAgent = this.plans.get(all);
    if (!byAgent) {
      byAgent = new Map();
      this.plans.set(all, byAgent);
    }
    let plan = byAgent.get(agent);
    if (!plan) {
      const limits = all.filter((l) => l.agent === undefined || l.agent === agent);
      plan = { others: limits.filter((l) => l.counter !== "requests"), requests: limits.filter((l) => l.counter === "requests") };
      byAgent.set(agent, plan);
    }
    return plan;
  }

  /** The UTC day of `now`, its string made once a day. */
  private dayOf(now: number): string {
    const t = this.today;
    if (now < t.from || now >= t.to) {
      const from = Math.floor(now / 86_400_000) * 86_400_000;
      this.today = { from, to: from + 86_400_000, day: dayOf(now) };
    }
    return this.today.day;
  }

  private judge(who: Who, agent: string, plan: { others: Limit[]; requests: Limit[] }): Admission | Promise<Admission> {
    const now = this.clock.now();
    for (const l of plan.others) {
      const used = this.used(l, now);
      const reached = used >= l.value;
      // Near the limit, one piece at a time: the next may only start if what is in flight cannot take it over.
      const flying = this.inFlight.get(who.id) ?? 0;
      const piece = Math.max(1, this.largest.get(`${who.id}\0${l.counter}`) ?? 1);
      if (reached || (flying > 0 && !this.closed && used + (flying + 1) * piece > l.value)) {
        if (reached) return this.refuse(who, l, now);
        // Waits for the flight to land rather than refusing what may still fit.
        return this.afterFlight(who).then(() => this.judge(who, agent, plan));
      }
    }
    if (plan.requests.length === 0) return this.admission(who, agent, false);
    return this.lease(who, agent, plan.requests);
  }

  /** The count `limit` judges: the store's as last seen plus this node's not written yet. */
  used(limit: Limit, now = this.clock.now()): number {
    const today = dayOf(now);
    const month = monthStart(now);
    let total = 0;
    const view = this.views.get(limit.against);
    if (view && view.month === month) total += this.sum(view.rows, limit, today, month);
    for (const source of [this.pending, this.flushing]) {
      const rows = source?.get(limit.against);
      if (rows) total += this.sum(rows, limit, today, month);
    }
    return total;
  }

  private sum(rows: Map<string, Counts>, limit: Limit, today: string, month: string): number {
    let total = 0;
    for (const [k, c] of rows) {
      const cut = k.indexOf("\0");
      if (inLimit(limit, k.slice(0, cut), k.slice(cut + 1), today, month)) total += counterValue(c, limit.counter);
    }
    return total;
  }

  private refuse(who: Who, limit: Limit, now: number): never {
    this.hooks.refused?.(limit);
    const resets = resetsAt(limit.per, now);
    if (who.device !== undefined) this.markLimited(who.device, resets, now);
    throw new UsageLimited(limit, resets, now);
  }

  private markLimited(key: string, resets: number, now: number): void {
    if (this.limitedDevices.has(key) || this.closed) return;
    const timer = setTimeout(
      () => {
        this.limitedDevices.delete(key);
        this.views.delete(`device:${key}`);
        try {
          this.hooks.deviceLimited?.(key);
        } catch {
          // A listener's failure is not the meter's.
        }
      },
      Math.min(2 ** 31 - 1, resets - now + 50),
    );
    timer.unref();
    this.limitedDevices.set(key, timer);
    try {
      this.hooks.deviceLimited?.(key);
    } catch {
      // As above.
    }
  }

  /** Resolves when a piece of `who`'s work in flight on this node ends (or the meter closes): then judged again. */
  private afterFlight(who: Who): Promise<void> {
    if (this.closed || (this.inFlight.get(who.id) ?? 0) === 0) return Promise.resolve();
    return new Promise((resolve) => {
      const waiting = this.landing.get(who.id);
      if (waiting) waiting.push(resolve);
      else this.landing.set(who.id, [resolve]);
    });
  }

  /** Wakes what waits on `id`'s flight (it judges again, so one piece may start for each that ended). */
  private landed(id: string): void {
    const waiting = this.landing.get(id);
    if (!waiting) return;
    this.landing.delete(id);
    for (const wake of waiting) wake();
  }

  /** Reads the views of `limits` that are older than a second; undefined when all are fresh. */
  private staleViews(limits: Limit[]): Promise<void> | undefined {
    const now = this.clock.now();
    const month = monthStart(now);
    const stale = [...new Set(limits.map((l) => l.against))].filter((p) => {
      const v = this.views.get(p);
      return !v || v.month !== month || now - v.readAt >= VIEW_MS;
    });
    if (stale.length === 0) return undefined;
    // An old view answers while a new one is read, once there is one.
    const missing = stale.filter((p) => this.views.get(p)?.month !== month);
    const reads = stale.map((p) => {
      let read = this.viewReads.get(p);
      if (!read) {
        read = this.serial(() => this.readViews([p])).finally(() => this.viewReads.delete(p));
        this.viewReads.set(p, read);
      }
      return read;
    });
    const all = Promise.all(reads).then(
      () => {},
      () => {},
    );
    return missing.length > 0 ? all : undefined;
  }

  private async readViews(principals: string[]): Promise<void> {
    const now = this.clock.now();
    const month = monthStart(now);
    try {
      const rows = await this.store.read((r) => r.usage.rows(principals, month));
      this.setViews(principals, rows, now, month);
    } catch (err) {
      this.hooks.storeError?.(err);
      // Judged on what the node holds meanwhile (usage.md §4).
      for (const p of principals) if (!this.views.has(p)) this.views.set(p, { rows: new Map(), month, readAt: now });
    }
  }

  private setViews(principals: string[], rows: UsageRow[], now: number, month: string): void {
    const fresh = new Map<string, View>(principals.map((p) => [p, { rows: new Map(), month, readAt: now }]));
    for (const r of rows) {
      const v = fresh.get(r.principal);
      if (!v) continue;
      const c = zeroCounts();
      addCounts(c, r);
      v.rows.set(`${r.day}\0${r.agent}`, c);
    }
    for (const [p, v] of fresh) this.views.set(p, v);
  }

  /** Runs `fn` after the meter's transactions before it. */
  private serial<T>(fn: () => Promise<T>): Promise<T> {
    const run = this.queue.then(fn, fn);
    this.queue = run.catch(() => {});
    return run;
  }

  private leaseKey(who: Who, agent: string): string {
    return `${who.id}\0${agent}`;
  }

  /** A request unit of the store's, claimed before the work starts. */
  private lease(who: Who, agent: string, limits: Limit[]): Admission | Promise<Admission> {
    const key = this.leaseKey(who, agent);
    const today = this.dayOf(this.clock.now());
    let lease = this.leases.get(key);
    if (lease && lease.day !== today) {
      // Yesterday's units go back with the next write.
      if (lease.free > 0) this.giveBack(who, agent, lease);
      lease = undefined;
    }
    if (!lease) {
      lease = { day: today, free: 0, claiming: undefined, took: 0, usedAt: 0 };
      this.leases.set(key, lease);
    }
    const current = lease;
    if (current.free > 0) {
      // Units claimed ahead are judged again: a limit lowered since (the operator's `perch peers
      // limits … 0`) must not let them all through. What the store holds counts this lease's
      // unused units as requests: they are taken off.
      const now = this.clock.now();
      const over = limits.find((l) => this.used(l, now) - current.free >= l.value);
      if (over) {
        this.giveBack(who, agent, current);
        this.refuse(who, over, now);
      }
      current.free--;
      current.usedAt = this.clock.now();
      // More is claimed before the units run out, off the request's path (a refusal then waits for a unit's request).
      if (current.took > 1 && current.free <= current.took / 4 && !current.claiming) {
        current.claiming = this.serial(() => this.claim(who, agent, limits, current, true))
          .catch(() => {})
          .finally(() => {
            current.claiming = undefined;
          });
      }
      return this.admission(who, agent, current);
    }
    current.claiming ??= this.serial(() => this.claim(who, agent, limits, current)).finally(() => {
      current.claiming = undefined;
    });
    return current.claiming.then(() => this.lease(who, agent, limits));
  }

  /** Claims request units in the store: as many as a share of what the limits leave, at least one, or refuses. */
  private async claim(who: Who, agent: string, limits: Limit[], lease: Lease, ahead = false): Promise<void> {
    const now = this.clock.now();
    const today = dayOf(now);
    const month = monthStart(now);
    const principals = [...new Set(limits.map((l) => l.against))];
    const device = who.device !== undefined;
    let refused: Limit | undefined;
    let rows: UsageRow[];
    try {
      rows = await this.store.transaction(async (tx) => {
        await tx.locks.take(...principals.map((p) => `usage:${p}`));
        const read = await tx.usage.rows(principals, month);
        let room = Number.POSITIVE_INFINITY;
        for (const l of limits) {
          let used = 0;
          for (const r of read) if (r.principal === l.against && inLimit(l, r.day, r.agent, today, month)) used += r.requests;
          // What this node answered and has not written yet counts too.
          for (const source of [this.pending, this.flushing]) {
            const mine = source?.get(l.against);
            if (mine) for (const [k, c] of mine) if (inLimit(l, k.slice(0, 10), k.slice(11), today, month)) used += c.requests;
          }
          if (l.value - used < room) {
            room = l.value - used;
            if (room <= 0) refused = l;
          }
        }
        if (refused) return read;
        const take = Math.max(1, Math.min(MAX_LEASE, Math.floor(room / 8)));
        lease.took = take;
        const deltas = [row(who.id, today, agent, take)];
        if (device) deltas.push(row(ALL_DEVICES, today, agent, take));
        await tx.usage.add(deltas);
        lease.free += take;
        for (const r of read)
          if (r.day === today && r.agent === agent && (r.principal === who.id || (device && r.principal === ALL_DEVICES))) r.requests += take;
        for (const p of [who.id, ...(device ? [ALL_DEVICES] : [])]) {
          if (!read.some((r) => r.principal === p && r.day === today && r.agent === agent)) read.push(row(p, today, agent, take));
        }
        return read;
      });
    } catch (err) {
      // Counting never fails a request (usage.md §4): the work goes on, judged on what the node holds
      // (its last view and what it has not written), and its unit is counted with the next write as
      // a claim's would have been (a leased unit is not counted again when answered).
      this.hooks.storeError?.(err);
      const reached = limits.find((l) => this.used(l, now) >= l.value);
      if (reached) this.refuse(who, reached, now);
      this.addTo(who.id, today, agent, { requests: 1 });
      if (device) this.addTo(ALL_DEVICES, today, agent, { requests: 1 });
      lease.free += 1;
      return;
    }
    this.setViews(principals, rows, now, month);
    // A claim made ahead refuses nobody: the next request finds no unit and claims (and is refused) itself.
    if (refused && !ahead) this.refuse(who, refused, now);
  }

  /** Unused request units of `lease` go back to the store with the next write. */
  private giveBack(who: Who, agent: string, lease: Lease): void {
    const n = lease.free;
    lease.free = 0;
    this.addTo(who.id, lease.day, agent, { requests: -n });
    if (who.device !== undefined) this.addTo(ALL_DEVICES, lease.day, agent, { requests: -n });
  }

  private admission(who: Who, agent: string, lease: Lease | false): Admission {
    let open = true;
    this.inFlight.set(who.id, (this.inFlight.get(who.id) ?? 0) + 1);
    const end = () => {
      if (!open) return false;
      open = false;
      const n = (this.inFlight.get(who.id) ?? 1) - 1;
      if (n <= 0) this.inFlight.delete(who.id);
      else this.inFlight.set(who.id, n);
      this.flushSoon();
      this.landed(who.id);
      return true;
    };
    return {
      add: (counts) => this.record(who, agent, counts),
      answered: () => {
        if (!end()) return;
        // A leased unit is in the store already.
        if (!lease) this.record(who, agent, { requests: 1 });
        else this.hooks.counted?.(agent, { requests: 1 });
      },
      abandon: () => {
        if (!end()) return;
        if (lease) lease.free++;
      },
    };
  }

  /** Counts of `who`'s work with `agent`, written with the next flush (with every device's sum for a device). */
  record(who: Who, agent: string, counts: UsageAdd): void {
    if (!this.counting) return;
    const day = this.dayOf(this.clock.now());
    counts = wholeCounts(counts);
    this.addTo(who.id, day, agent, counts);
    if (who.device !== undefined) this.addTo(ALL_DEVICES, day, agent, counts);
    this.hooks.counted?.(agent, counts);
    for (const f of ["input_tokens", "output_tokens", "speech_chars", "audio_ms"] as const) {
      const v = counts[f];
      if (!v) continue;
      const counter: LimitCounter = f === "speech_chars" ? "speech_chars" : f === "audio_ms" ? "audio_seconds" : "tokens";
      const k = `${who.id}\0${counter}`;
      const value = f === "audio_ms" ? v / 1000 : v;
      if (value > (this.largest.get(k) ?? 0)) this.largest.set(k, value);
    }
  }

  private addTo(principal: string, day: string, agent: string, counts: UsageAdd): void {
    let rows = this.pending.get(principal);
    if (!rows) {
      rows = new Map();
      this.pending.set(principal, rows);
    }
    const k = `${day}\0${agent}`;
    let c = rows.get(k);
    if (!c) {
      c = zeroCounts();
      rows.set(k, c);
    }
    addCounts(c, counts);
    if (counts.estimated) this.estimated.add(`${principal}\0${k}`);
  }

  /** Work ended: its counts are written within END_FLUSH_MS (together with other ends). */
  private flushSoon(): void {
    if (this.endTimer || this.closed) return;
    this.endTimer = setTimeout(() => {
      this.endTimer = undefined;
      this.flush(false).catch(() => {});
    }, END_FLUSH_MS);
    this.endTimer.unref();
  }

  /**
   * Writes the counts gathered (one transaction, one statement per 200 rows); with `leases`, unused
   * request units go back too. A store error keeps the counts for the next try (logged and counted).
   */
  flush(leases: boolean | "all" = false): Promise<void> {
    return this.serial(async () => {
      if (leases) {
        const idle = this.clock.now() - LEASE_IDLE_MS;
        for (const [k, lease] of this.leases) {
          if (lease.free <= 0 || (leases !== "all" && (lease.usedAt > idle || lease.claiming))) continue;
          const cut = k.indexOf("\0");
          const id = k.slice(0, cut);
          this.giveBack({ id, ...(id.startsWith("device:") ? { device: id.slice(7) } : {}) }, k.slice(cut + 1), lease);
        }
      }
      if (this.pending.size === 0) return;
      const batch = this.pending;
      const estimated = this.estimated;
      this.pending = new Map();
      this.estimated = new Set();
      this.flushing = batch;
      const deltas: UsageDelta[] = [];
      for (const [principal, rows] of batch) {
        for (const [k, c] of rows) {
          const cut = k.indexOf("\0");
          deltas.push({ principal, day: k.slice(0, cut), agent: k.slice(cut + 1), ...c, estimated: estimated.has(`${principal}\0${k}`) ? 1 : 0 });
        }
      }
      try {
        await this.store.transaction((tx) => tx.usage.add(deltas));
      } catch (err) {
        this.flushing = undefined;
        for (const d of deltas) this.addTo(d.principal, d.day, d.agent, { ...d, estimated: d.estimated === 1 });
        this.hooks.storeError?.(err);
        return;
      }
      // What was written is in the store now: the views hold it until they are read again.
      const month = monthStart(this.clock.now());
      for (const d of deltas) {
        const v = this.views.get(d.principal);
        if (!v || v.month !== month) continue;
        const k = `${d.day}\0${d.agent}`;
        let c = v.rows.get(k);
        if (!c) {
          c = zeroCounts();
          v.rows.set(k, c);
        }
        addCounts(c, d);
      }
      this.flushing = undefined;
    });
  }

  /** Whether `who`'s use of `agent` is limited now, judged on what this node holds (no store read; a first check reads). */
  async limitedNow(who: Who, agent: string, o: { requests?: boolean } = {}): Promise<Limit | undefined> {
    if (!this.counting) return undefined;
    const all = await this.limits(who);
    // A tool call belongs to a request already admitted (which may hold the last request allowed).
    const limits = all.filter((l) => (l.agent === undefined || l.agent === agent) && (o.requests !== false || l.counter !== "requests"));
    if (limits.length === 0) return undefined;
    const stale = this.staleViews(limits);
    if (stale) await stale;
    const now = this.clock.now();
    return limits.find((l) => this.used(l, now) >= l.value);
  }
}

/** The admission of work that is not counted (`usage.count: false`). */
const UNCOUNTED: Admission = Object.freeze({ add: () => {}, answered: () => {}, abandon: () => {} });

/** The most one piece of work may add to a counter (a provider's 1e300 must not overflow the store's bigint). */
const MAX_PIECE = 1e12;

/**
 * Counts as a provider may report them (a string, a fraction, a negative, NaN, 1e300) made whole,
 * non-negative and bounded: one bad value must not fail the request, nor every later write of the
 * node's counts (a batch the store refuses is kept and retried).
 */
function wholeCounts(counts: UsageAdd): UsageAdd {
  const out: UsageAdd = counts.estimated ? { estimated: true } : {};
  for (const f of COUNT_FIELDS) {
    const v: unknown = counts[f];
    if (typeof v === "number" && v > 0) out[f] = Math.min(Math.round(v), MAX_PIECE);
  }
  return out;
}

function row(principal: string, day: string, agent: string, requests: number): UsageRow {
  const c = zeroCounts();
  c.requests = requests;
  return { principal, day, agent, ...c, estimated: 0 };
}

export { COUNT_FIELDS };
