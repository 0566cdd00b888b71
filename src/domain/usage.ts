import type { KeyLimitConfig } from "../config/config.ts";
import type { UsageView } from "../protocol/public.ts";
import type { UsageRow } from "../store/usage.ts";
import type { DomainContext } from "./context.ts";
import { DomainError } from "./errors.ts";
import {
  ALL_DEVICES,
  addCounts,
  type Counts,
  counterValue,
  dayOf,
  devicePrincipal,
  type Limit,
  type LimitCounter,
  monthStart,
  type Period,
  parseDeviceLimits,
  resetsAt,
  shown,
  zeroCounts,
} from "./usage-limits.ts";
import { UsageMeter, type Who } from "./usage-meter.ts";

export { UsageLimited } from "./usage-meter.ts";

const DAY_MS = 86_400_000;

/** What devices and applications used, their limits, and the views of both (usage.md). */
export class UsageService {
  readonly meter: UsageMeter;
  private readonly ctx: DomainContext;

  constructor(ctx: DomainContext) {
    this.ctx = ctx;
    this.meter = new UsageMeter({ store: ctx.store, clock: ctx.clock, config: ctx.config });
  }

  /** A device as the meter knows it. */
  static device(key: string): Who {
    return { id: devicePrincipal(key), device: key };
  }

  /** `GET /me/usage`, `GET /side-control/usage`: the device's day and month against its limits, read from the store. */
  async view(key: string): Promise<UsageView> {
    const who = UsageService.device(key);
    const now = this.ctx.clock.now();
    const today = dayOf(now);
    const month = monthStart(now);
    const limits = (await this.meter.limits(who)).filter((l) => l.agent === undefined);
    const principals = [who.id, ...(limits.some((l) => l.against === ALL_DEVICES) ? [ALL_DEVICES] : [])];
    const rows = await this.ctx.store.read((r) => r.usage.rows(principals, month));
    const totals = (principal: string, per: Period): Counts => {
      const c = zeroCounts();
      const from = per === "day" ? today : month;
      for (const r of rows) if (r.principal === principal && r.day >= from) addCounts(c, r);
      for (const u of this.meter.unwritten(principal, from)) addCounts(c, u.counts);
      // Units this node claimed and has not used yet are no requests answered.
      c.requests = Math.max(0, c.requests - this.meter.unusedUnits(principal, from));
      return c;
    };
    let limited: LimitCounter | null = null;
    for (const l of limits) {
      if (limited === null && counterValue(totals(l.against, l.per), l.counter) >= l.value) limited = l.counter;
    }
    const period = (per: Period) => {
      const own: Partial<Record<LimitCounter, number>> = {};
      for (const l of limits) if (l.per === per && l.against === who.id) own[l.counter] = Math.min(own[l.counter] ?? l.value, l.value);
      return { used: shown(totals(who.id, per)), limits: own, resets_at_unix_ms: resetsAt(per, now) };
    };
    return { day: period("day"), month: period("month"), limited };
  }

  /** Rows for the operators' report (`perch usage`): of one device or API key, or all, from `days` days ago (today is 1). */
  async report(o: { key?: string; apiKeyId?: string; days: number }): Promise<UsageRow[]> {
    const from = dayOf(this.ctx.clock.now() - (o.days - 1) * DAY_MS);
    const principal = o.key !== undefined ? devicePrincipal(o.key) : o.apiKeyId !== undefined ? `api_key:${o.apiKeyId}` : undefined;
    // Unused request units go back first: the report counts requests answered.
    await this.meter.flush("all");
    return await this.ctx.store.read((r) => (principal ? r.usage.rows([principal], from) : r.usage.all(from)));
  }

  /** A device's own limits (`perch peers limits`), replacing the configured `device` ones; null clears them. */
  async setDeviceLimits(key: string, limits: KeyLimitConfig[] | null): Promise<void> {
    const done = await this.ctx.store.transaction((tx) => tx.usage.setDeviceLimits(key, limits === null ? null : JSON.stringify(limits)));
    if (!done) throw new DomainError("not_found", "PEER_NOT_FOUND", "no peer has this key");
    this.meter.forgetDevice(key);
  }

  /** The device's own limits as stored (null: the configured `device` limits apply). */
  async deviceLimits(key: string): Promise<KeyLimitConfig[] | null> {
    const text = (await this.ctx.store.read((r) => r.usage.deviceLimits([key]))).get(key);
    return (text !== undefined && parseDeviceLimits(text)) || null;
  }

  /** Deletes rows older than `usage.retention_days`. */
  async sweep(): Promise<void> {
    const cutoff = dayOf(this.ctx.clock.now() - this.ctx.config.usage.retention_days * DAY_MS);
    await this.ctx.store.transaction(async (tx) => {
      await tx.usage.deleteBefore(cutoff);
      await tx.usage.deleteOrphans();
    });
  }

  /** Tells the device's Side Control streams of its usage now (a limit reached, or reset). */
  async announce(key: string): Promise<void> {
    const view = await this.view(key);
    this.ctx.events.usage(key, view);
  }
}

export type { Limit };
