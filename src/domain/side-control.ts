import { hashToken, newId, newToken } from "../crypto/tokens.ts";
import type { DeviceToken, SideControlSessionList } from "../protocol/public.ts";
import { invalidSession, revokeSession } from "./auth.ts";
import type { DomainContext } from "./context.ts";
import { DomainError } from "./errors.ts";
import type { SideControlPrincipal } from "./principal.ts";
import { RateLimiter } from "./rate-limiter.ts";

export const DEVICE_TOKEN_TTL_MS = 5 * 60 * 1000;
/** The shape of the ids this server issues (`newId`); anything else is unknown without a lookup. */
const ISSUED_ID = /^[1-9A-HJ-NP-Za-km-z]{1,64}$/;
export const MAX_USABLE_DEVICE_TOKENS = 20;

/** What a device manages about its Side Control: device tokens and the sessions they became. */
export class SideControlService {
  private readonly tokenLimiter: RateLimiter;

  private readonly ctx: DomainContext;

  constructor(ctx: DomainContext) {
    this.ctx = ctx;
    this.tokenLimiter = new RateLimiter(ctx.config.rate_limits.device_token_per_device, ctx.clock, ctx.config.limits.rate_limiter_keys);
  }

  async createDeviceToken(deviceKey: string): Promise<DeviceToken> {
    const { store, clock } = this.ctx;
    const retryAfter = this.tokenLimiter.hit(deviceKey);
    if (retryAfter > 0) throw new DomainError("rate_limited", "RATE_LIMITED", "too many device tokens created", undefined, retryAfter);
    const now = clock.now();
    const token = newToken();
    const row = { id: newId(), token_hash: hashToken(token), target_key: deviceKey, created_at: now, expires_at: now + DEVICE_TOKEN_TTL_MS, consumed_at: null };
    await store.transaction(async (tx) => {
      await tx.locks.take(`device-tokens:${deviceKey}`);
      if ((await tx.deviceTokens.countUsable(deviceKey, now)) >= MAX_USABLE_DEVICE_TOKENS) {
        throw new DomainError("conflict", "TOO_MANY_DEVICE_TOKENS", `at most ${MAX_USABLE_DEVICE_TOKENS} unused device tokens may exist at once`);
      }
      await tx.deviceTokens.insert(row);
    });
    return { id: row.id, token, expires_at: row.expires_at };
  }

  async revokeDeviceToken(deviceKey: string, id: string): Promise<void> {
    const now = this.ctx.clock.now();
    if (!ISSUED_ID.test(id) || !(await this.ctx.store.transaction((tx) => tx.deviceTokens.revoke(id, deviceKey, now)))) {
      throw new DomainError("not_found", "DEVICE_TOKEN_NOT_FOUND", "no unused device token of this device has that id");
    }
  }

  async listSessions(deviceKey: string): Promise<SideControlSessionList> {
    const now = this.ctx.clock.now();
    const rows = await this.ctx.store.read((r) => r.sessions.listLive(now, { kind: "side_control", targetKey: deviceKey }));
    return { items: rows.map((r) => ({ id: r.id, controller_public_key: r.public_key, issued_at: r.created_at, expires_at: r.expires_at })) };
  }

  async revokeSession(deviceKey: string, id: string): Promise<void> {
    if (!ISSUED_ID.test(id) || !(await revokeSession(this.ctx, id, deviceKey))) {
      throw new DomainError("not_found", "SIDE_CONTROL_SESSION_NOT_FOUND", "no live Side Control session of this device has that id");
    }
  }

  /** The controller ends its own session (`DELETE /side-control/session`, the app's "forget this device"). */
  async endOwnSession(principal: SideControlPrincipal): Promise<void> {
    // Revoked or expired since the request was authenticated: as if it had been before.
    if (!(await revokeSession(this.ctx, principal.sessionId, principal.targetKey))) throw invalidSession("the session is unknown, expired or revoked");
  }
}
