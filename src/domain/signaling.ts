import { canonicalKey, decodeKey, InvalidKeyError, sharedSecret } from "../crypto/keys.ts";
import { parseNonce, SealError, SealedExchange } from "../crypto/sealed-offer.ts";
import type { AuthService } from "./auth.ts";
import type { DomainContext } from "./context.ts";
import { DomainError } from "./errors.ts";
import { RateLimiter } from "./rate-limiter.ts";

export const OFFER_MAX_SKEW_S = 120;
export const SIGNALING_NONCE_TTL_MS = 300_000;

export interface OfferHeaders {
  publicKey: string | undefined;
  timestamp: string | undefined;
  nonce: string | undefined;
  registrationToken: string | undefined;
}

/** An offer whose headers passed checks 2–5. */
export interface CheckedOffer {
  publicKey: string;
  timestamp: string;
  nonceText: string;
  nonce: Uint8Array;
  registrationToken: string | undefined;
}

/** An offer that is authentic, fresh and allowed: its SDP and the exchange that seals the answer. */
export interface AcceptedOffer {
  publicKey: string;
  sdp: string;
  exchange: SealedExchange;
  /** Whether the key is registered already (otherwise it registers once connected). */
  registered: boolean;
}

/** The sealed offer's checks 2–5 and 7–9 of the transport contract, in its order. */
export class SignalingService {
  private readonly byKey: RateLimiter;
  private readonly ctx: DomainContext;
  private readonly auth: AuthService;

  constructor(ctx: DomainContext, auth: AuthService) {
    this.ctx = ctx;
    this.auth = auth;
    this.byKey = new RateLimiter(ctx.config.rate_limits.offer_per_key, ctx.clock, ctx.config.limits.rate_limiter_keys);
  }

  /** Checks 2–5: key, timestamp, freshness, nonce. */
  checkHeaders(h: OfferHeaders): CheckedOffer {
    const publicKey = canonicalKey(h.publicKey);
    if (!publicKey) throw new DomainError("invalid", "INVALID_PUBLIC_KEY", "X-Giznet-Public-Key is missing or not a base58 X25519 key");
    const timestamp = h.timestamp;
    if (!timestamp || !/^-?[0-9]{1,15}$/.test(timestamp)) throw new DomainError("invalid", "INVALID_TIMESTAMP", "X-Giznet-Timestamp must be Unix seconds");
    if (Math.abs(Number(timestamp) - this.ctx.clock.now() / 1000) > OFFER_MAX_SKEW_S) {
      throw new DomainError("invalid", "EXPIRED_REQUEST", `X-Giznet-Timestamp is more than ${OFFER_MAX_SKEW_S} s from the server's time`);
    }
    const nonce = parseNonce(h.nonce);
    if (!nonce) throw new DomainError("invalid", "INVALID_NONCE", "X-Giznet-Nonce must be 16 bytes of base64url without padding");
    return { publicKey, timestamp, nonceText: h.nonce as string, nonce, registrationToken: h.registrationToken };
  }

  /** Checks 7–9: opens the body, records the nonce, applies the rate limit and the registration policy. */
  async accept(offer: CheckedOffer, body: Uint8Array): Promise<AcceptedOffer> {
    let shared: Uint8Array;
    try {
      shared = sharedSecret(this.ctx.serverKey.privateKeyObject, decodeKey(offer.publicKey));
    } catch (err) {
      if (err instanceof InvalidKeyError) throw new DomainError("invalid", "INVALID_PUBLIC_KEY", "X-Giznet-Public-Key is not a usable X25519 key");
      throw err;
    }
    const exchange = new SealedExchange(shared, offer.publicKey, offer.timestamp, offer.nonceText, offer.nonce);
    let sdp: string;
    try {
      sdp = exchange.openRequest(body);
    } catch (err) {
      if (err instanceof SealError)
        throw new DomainError("unauthenticated", "UNAUTHORIZED", "the sealed offer does not open with this key, timestamp and nonce");
      throw err;
    }
    const now = this.ctx.clock.now();
    limit(this.byKey.check(offer.publicKey));
    const fresh = await this.ctx.store.transaction((tx) => tx.signalingNonces.claim(offer.publicKey, offer.nonceText, now + SIGNALING_NONCE_TTL_MS, now));
    if (!fresh) throw new DomainError("conflict", "REPLAYED_NONCE", "this nonce was already used by this key");
    // Only offers that verify count, so nobody can use up another key's allowance.
    limit(this.byKey.hit(offer.publicKey));
    const peer = await this.ctx.store.read((r) => r.peers.get(offer.publicKey));
    if (peer?.status === "blocked") throw new DomainError("forbidden", "PEER_BLOCKED", "this peer is blocked");
    if (!peer) this.auth.checkRegistrationPolicy(offer.registrationToken);
    return { publicKey: offer.publicKey, sdp, exchange, registered: peer !== undefined };
  }
}

function limit(retryAfter: number): void {
  if (retryAfter > 0) throw new DomainError("rate_limited", "RATE_LIMITED", "too many offers for this key", undefined, retryAfter);
}
