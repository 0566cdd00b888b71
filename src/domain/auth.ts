import { createSecretKey, type KeyObject, timingSafeEqual } from "node:crypto";
import { LRUCache } from "lru-cache";
import { type AssertionClaims, AssertionError, parseAssertion, verifyAssertion } from "../crypto/assertion.ts";
import { canonicalKey, decodeKey, InvalidKeyError, sharedSecret } from "../crypto/keys.ts";
import { hashToken, newId, newToken } from "../crypto/tokens.ts";
import type { LoginRequest, LoginResult } from "../protocol/public.ts";
import type { Repositories } from "../store/index.ts";
import type { PeerRow } from "../store/peers.ts";
import type { SessionWithPeers } from "../store/sessions.ts";
import { DAY_MS, type DomainContext } from "./context.ts";
import { DomainError } from "./errors.ts";
import type { Principal } from "./principal.ts";
import { RateLimiter } from "./rate-limiter.ts";

export const PRIMARY_SESSION_TTL_MS = DAY_MS;
/**
 * How long a session read for one request answers the next ones with the same bearer, on SQLite:
 * any change that can end it, by this process or another, ends it at once (`Store.authStamp`). On
 * PostgreSQL every request reads its session: another node's revocation acts at once there too.
 */
export const SESSION_CACHE_MS = 1_000;
export const SIDE_CONTROL_SESSION_TTL_MS = DAY_MS;

export interface LoginInput {
  /** The assertion from `Authorization: Bearer …`, or undefined when that header is absent or not a bearer. */
  assertion: string | undefined;
  publicKey: string | undefined;
  registrationToken: string | undefined;
  request: LoginRequest;
  /** Client address, for the per-address rate limit. */
  address: string;
}

/** Logins (assertion → session) and bearer authentication. */
export class AuthService {
  private readonly byAddress: RateLimiter;
  private readonly byKey: RateLimiter;
  /** X25519 with the server key is the costliest step of a login; results are cached per caller key. */
  private readonly secrets: LRUCache<string, KeyObject>;
  /** Sessions by token hash, read for a recent request (see SESSION_CACHE_MS). */
  private readonly sessions: LRUCache<string, CachedSession>;

  private readonly ctx: DomainContext;

  constructor(ctx: DomainContext) {
    this.ctx = ctx;
    const { rate_limits, limits } = ctx.config;
    this.byAddress = new RateLimiter(rate_limits.login_per_address, ctx.clock, limits.rate_limiter_keys);
    this.byKey = new RateLimiter(rate_limits.login_per_key, ctx.clock, limits.rate_limiter_keys);
    this.secrets = new LRUCache({ max: ctx.config.limits.key_cache_size });
    this.sessions = new LRUCache({ max: ctx.config.limits.key_cache_size });
  }

  /** X25519(server private, `publicKey`) as an HMAC key; throws INVALID_PUBLIC_KEY for an unusable key. */
  sharedSecretWith(publicKey: string): KeyObject {
    let secret = this.secrets.get(publicKey);
    if (!secret) {
      try {
        secret = createSecretKey(sharedSecret(this.ctx.serverKey.privateKeyObject, decodeKey(publicKey)));
      } catch (err) {
        if (err instanceof InvalidKeyError) throw new DomainError("unauthenticated", "INVALID_PUBLIC_KEY", "X-Public-Key is not a usable X25519 key");
        throw err;
      }
      this.secrets.set(publicKey, secret);
    }
    return secret;
  }

  /**
   * Exchanges a verified assertion for a session. Every check runs before the one transaction that
   * claims the nonce (and, for Side Control, consumes the device token) and writes the session,
   * so a refused login writes nothing.
   */
  async login(input: LoginInput): Promise<LoginResult> {
    limit(this.byAddress.hit(input.address));
    const { key, claims, now } = this.verify(input);
    // Only an assertion that fully verifies counts against its key, replay check included: so the
    // count grows in the transaction, once the nonce is claimed (a 429 there rolls the login back).
    limit(this.byKey.check(key));
    const claimNonce = async (tx: Repositories) => {
      if (!(await tx.assertionNonces.claim(key, claims.nonce, claims.exp * 1000, now))) {
        throw new DomainError("unauthenticated", "INVALID_ASSERTION", "invalid assertion: replayed nonce");
      }
      limit(this.byKey.hit(key));
    };
    const caller = await this.ctx.store.read((r) => r.peers.get(key));
    if (caller?.status === "blocked") throw new DomainError("forbidden", "PEER_BLOCKED", "this peer is blocked");
    const session = { id: newId(), token: newToken(), createdAt: now };
    return input.request.grant_type === "side_control"
      ? this.grantSideControl(key, input.request.device_token as string, session, claimNonce)
      : this.grantPrimary(key, caller, input.registrationToken, session, claimNonce);
  }

  /** The caller's canonical key and the assertion's claims, checked against the key and the clock. */
  private verify(input: LoginInput): { key: string; claims: AssertionClaims; now: number } {
    if (!input.assertion) throw new DomainError("unauthenticated", "MISSING_ASSERTION", "Authorization: Bearer <assertion> is required");
    const key = canonicalKey(input.publicKey);
    if (!key) throw new DomainError("unauthenticated", "INVALID_PUBLIC_KEY", "X-Public-Key is missing or not a base58 X25519 key");
    const secret = this.sharedSecretWith(key);
    const now = this.ctx.clock.now();
    try {
      const claims = verifyAssertion(parseAssertion(input.assertion), {
        issuer: key,
        audience: this.ctx.serverKey.publicKeyText,
        now: Math.floor(now / 1000),
        sharedSecret: secret,
      });
      return { key, claims, now };
    } catch (err) {
      if (err instanceof AssertionError) throw new DomainError("unauthenticated", "INVALID_ASSERTION", `invalid assertion: ${err.message}`);
      throw err;
    }
  }

  private async grantPrimary(key: string, caller: PeerRow | undefined, registrationToken: string | undefined, session: NewSession, claimNonce: ClaimNonce) {
    if (!caller) this.checkRegistrationPolicy(registrationToken);
    const expiresAt = session.createdAt + PRIMARY_SESSION_TTL_MS;
    await this.ctx.store.transaction(async (tx) => {
      await claimNonce(tx);
      // Read again, kept until the commit: the operator may have removed the peer since `caller`
      // was read, and its session would then name no peer.
      if (!(await tx.peers.getForShare(key))) {
        if (caller) this.checkRegistrationPolicy(registrationToken);
        await tx.peers.register(newPeer(key, session.createdAt));
      }
      await tx.locks.take(`sessions:${key}`);
      // The newest sessions win: the oldest beyond the cap are signed out.
      await tx.sessions.trimPrimary(key, session.createdAt, this.ctx.config.limits.primary_sessions_per_device - 1);
      await tx.sessions.insert(sessionRow(session, "primary", key, key, expiresAt));
    });
    return result(session, expiresAt, "primary");
  }

  private async grantSideControl(key: string, deviceToken: string, session: NewSession, claimNonce: ClaimNonce) {
    const { store, config } = this.ctx;
    const now = session.createdAt;
    const tokenHash = hashToken(deviceToken);
    const target = await store.read(async (r) => {
      const token = await r.deviceTokens.findUsable(tokenHash, now);
      return token && (await r.peers.get(token.target_key));
    });
    if (!target) throw invalidDeviceToken();
    if (target.status === "blocked") throw new DomainError("forbidden", "PEER_BLOCKED", "the device behind this token is blocked");
    const expiresAt = now + SIDE_CONTROL_SESSION_TTL_MS;
    const { side_control_sessions_per_device: perDevice, side_control_sessions_per_controller: perController } = config.limits;
    await store.transaction(async (tx) => {
      await tx.locks.take(`sessions:${target.public_key}`, `controller:${key}`);
      if ((await tx.sessions.countLive(now, { kind: "side_control", targetKey: target.public_key })) >= perDevice) {
        throw tooManySessions(`this device already has ${perDevice} live Side Control sessions`);
      }
      if ((await tx.sessions.countLive(now, { kind: "side_control", publicKey: key })) >= perController) {
        throw tooManySessions(`this key already holds ${perController} live Side Control sessions`);
      }
      await claimNonce(tx);
      // The conditional update decides: of concurrent logins with one token, exactly one gets here.
      if (!(await tx.deviceTokens.consume(tokenHash, now))) throw invalidDeviceToken();
      await tx.sessions.insert(sessionRow(session, "side_control", key, target.public_key, expiresAt));
    });
    return result(session, expiresAt, "side_control");
  }

  /** Whether an unknown key may register now (primary login, first WebRTC connection). */
  checkRegistrationPolicy(registrationToken: string | undefined): void {
    const { policy, tokens } = this.ctx.config.registration;
    if (policy === "closed") throw new DomainError("forbidden", "PEER_NOT_REGISTERED", "this server only accepts peers its operator registered");
    if (policy === "token" && !(registrationToken && tokens.some((t) => safeEqual(t, registrationToken)))) {
      throw new DomainError("unauthenticated", "REGISTRATION_REQUIRED", "registering a new peer needs a valid X-Registration-Token");
    }
  }

  /** Every live session (operator view). */
  liveSessions() {
    return this.ctx.store.read((r) => r.sessions.listLive(this.ctx.clock.now()));
  }

  /** Revokes any live session by id (operator action); false when there is none. */
  revokeSession(id: string): Promise<boolean> {
    return revokeSession(this.ctx, id);
  }

  /** Resolves a bearer access token, re-checking the session and the peers behind it. */
  authenticate(bearer: string | undefined, publicKeyHeader: string | undefined): Promise<Principal> {
    try {
      if (!bearer) throw invalidSession("Authorization: Bearer <access_token> is required");
      // A cached session is checked at once: no further turn of the loop on the hottest routes.
      const row = this.session(hashToken(bearer));
      return row instanceof Promise ? row.then((r) => this.principalOf(r, publicKeyHeader)) : Promise.resolve(this.principalOf(row, publicKeyHeader));
    } catch (err) {
      return Promise.reject(err);
    }
  }

  /** The principal of a session read for a request, once the session and the peers behind it are checked. */
  private principalOf(row: SessionWithPeers | undefined, publicKeyHeader: string | undefined): Principal {
    if (!row || row.revoked_at !== null || row.expires_at <= this.ctx.clock.now()) throw invalidSession("the session is unknown, expired or revoked");
    if (publicKeyHeader !== undefined && canonicalKey(publicKeyHeader) !== row.public_key) {
      throw new DomainError("unauthenticated", "PUBLIC_KEY_MISMATCH", "X-Public-Key does not match the session");
    }
    if (row.kind === "primary") {
      checkPeer(row.peer_status, false);
      return { kind: "primary", publicKey: row.public_key, sessionId: row.id };
    }
    checkPeer(row.target_status, false);
    checkPeer(row.peer_status, true);
    return { kind: "side_control", publicKey: row.public_key, targetKey: row.target_key as string, sessionId: row.id, expiresAt: row.expires_at };
  }

  /** The session behind a token hash: the cached read while nothing it depends on changed, else a new one. */
  private session(tokenHash: string): SessionWithPeers | Promise<SessionWithPeers | undefined> {
    const stamp = this.ctx.store.authStamp();
    const now = this.ctx.clock.now();
    const cached = stamp === undefined ? undefined : this.sessions.get(tokenHash);
    if (cached && cached.stamp === stamp && now - cached.at < SESSION_CACHE_MS) return cached.row;
    return this.ctx.store
      .read((r) => r.sessions.findByTokenHash(tokenHash))
      .then((row) => {
        if (stamp !== undefined && row) this.sessions.set(tokenHash, { row, stamp, at: now });
        return row;
      });
  }

  /**
   * The primary principal of a connection that already proved `peerKey` (a WebRTC connection's
   * stream): no bearer, but the peer is re-checked on every request, as a session's is.
   */
  async authenticateConnection(peerKey: string, publicKeyHeader: string | undefined): Promise<Principal> {
    if (publicKeyHeader !== undefined && canonicalKey(publicKeyHeader) !== peerKey) {
      throw new DomainError("unauthenticated", "PUBLIC_KEY_MISMATCH", "X-Public-Key does not match the connection's key");
    }
    const peer = await this.ctx.store.read((r) => r.peers.get(peerKey));
    if (!peer) throw invalidSession("the peer behind this connection is not registered");
    checkPeer(peer.status, false);
    return { kind: "primary", publicKey: peerKey };
  }
}

interface CachedSession {
  row: SessionWithPeers;
  /** `Store.authStamp()` read before the row was. */
  stamp: number;
  at: number;
}

function checkPeer(status: string | null, mayBeUnregistered: boolean): void {
  if (status === null && !mayBeUnregistered) throw invalidSession("the peer behind this session was removed");
  if (status === "blocked") throw new DomainError("forbidden", "PEER_BLOCKED", "the peer behind this session is blocked");
}

function limit(retryAfter: number): void {
  if (retryAfter > 0) throw new DomainError("rate_limited", "RATE_LIMITED", "too many requests", undefined, retryAfter);
}

/**
 * Revokes a live session (with `targetKey`: only a Side Control session aimed at that device);
 * its event streams end on every node, whichever process this runs in. False when there was none.
 */
export async function revokeSession(ctx: DomainContext, id: string, targetKey?: string): Promise<boolean> {
  const now = ctx.clock.now();
  const publish = await ctx.store.transaction(async (tx) => ((await tx.sessions.revoke(id, now, targetKey)) ? ctx.events.sessionRevoked(tx, id) : undefined));
  publish?.();
  return publish !== undefined;
}

export function invalidSession(message: string): DomainError {
  return new DomainError("unauthenticated", "INVALID_SESSION", message);
}

function tooManySessions(message: string): DomainError {
  return new DomainError("conflict", "TOO_MANY_SESSIONS", `${message}; revoke one or wait for one to expire`);
}

function invalidDeviceToken(): DomainError {
  return new DomainError("unauthenticated", "INVALID_DEVICE_TOKEN", "the device token is unknown, expired, revoked or already used");
}

function safeEqual(a: string, b: string): boolean {
  const x = Buffer.from(a);
  const y = Buffer.from(b);
  return x.length === y.length && timingSafeEqual(x, y);
}

export function newPeer(publicKey: string, now: number, role = "client"): PeerRow {
  return { public_key: publicKey, role, status: "active", device_info: "{}", created_at: now, updated_at: now };
}

interface NewSession {
  id: string;
  token: string;
  createdAt: number;
}

type ClaimNonce = (tx: Repositories) => Promise<void>;

/** `target` is the device the session acts on: the peer itself for a primary session. */
function sessionRow(s: NewSession, kind: string, key: string, target: string, expiresAt: number) {
  return {
    id: s.id,
    token_hash: hashToken(s.token),
    kind,
    public_key: key,
    target_key: target,
    created_at: s.createdAt,
    expires_at: expiresAt,
    revoked_at: null,
  };
}

function result(s: NewSession, expiresAt: number, grant: "primary" | "side_control"): LoginResult {
  return { access_token: s.token, token_type: "Bearer", expires_at: expiresAt, session_id: s.id, grant_type: grant };
}
