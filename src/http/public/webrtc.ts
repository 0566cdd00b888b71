import { createRoute, z } from "@hono/zod-openapi";
import type { Domain } from "../../domain/index.ts";
import type { PrimaryPrincipal } from "../../domain/principal.ts";
import type { AcceptedOffer } from "../../domain/signaling.ts";
import { readBodyWithin } from "../body.ts";
import type { App } from "../env.ts";
import { ApiError, invalid } from "../errors.ts";
import { requestHeader } from "../headers.ts";
import type { Callers } from "../principal.ts";
import { jsonBodyLimit } from "./limits.ts";
import { bearerSecurity, errors, json } from "./responses.ts";

export const OFFER_PATH = "/webrtc/v1/offer";
export const OFFER_BODY_LIMIT = 256 * 1024;

/** What the HTTP surface needs of the WebRTC transport. */
export interface WebRtcPort {
  /**
   * Refuses an offer the node cannot take (503 `NODE_FULL` / `NODE_DRAINING` with `Retry-After`),
   * before anything else is done with it: no nonce is spent, so a balancer may send the same
   * request to another node (docs/decisions.md, issue 48).
   */
  admit?(): void;
  /** Checks 10–13 and the answer SDP; `timing` records phases for Server-Timing; `from` is the client's own address, when known. */
  answer(offer: AcceptedOffer, timing: (phase: string, ms: number) => void, from: string | undefined): Promise<string>;
  /** Plays a tone to the key's connection, on whichever node holds it; undefined when none does. */
  playTone(publicKey: string, frequencyHz: number, durationMs: number): Promise<{ frames: number } | undefined>;
}

const offerRoute = createRoute({
  method: "post",
  path: OFFER_PATH,
  tags: ["webrtc"],
  summary: "Exchange a sealed SDP offer for a sealed answer (transport contract, section 1)",
  request: {
    headers: z.object({
      "x-giznet-public-key": z.string().optional(),
      "x-giznet-timestamp": z.string().optional(),
      "x-giznet-nonce": z.string().optional(),
    }),
    body: { required: true, content: { "application/octet-stream": { schema: z.string().openapi({ format: "binary" }) } } },
  },
  responses: {
    200: { description: "The sealed answer SDP", content: { "application/octet-stream": { schema: z.string().openapi({ format: "binary" }) } } },
    ...errors(400, 401, 403, 409, 413, 415, 429, 500, 503),
  },
});

const ToneRequest = z
  .strictObject({
    frequency_hz: z.number().min(20).max(20_000).optional(),
    duration_ms: z.number().int().min(20).max(10_000).optional(),
  })
  .openapi("ToneRequest");
const ToneResult = z.object({ frames: z.number().int() }).openapi("ToneResult");

const toneRoute = createRoute({
  method: "post",
  path: "/me/audio/tone",
  tags: ["webrtc"],
  security: bearerSecurity,
  summary: "Play a test tone on the caller's WebRTC audio track (on whichever node holds its connection)",
  request: { body: { required: false, content: { "application/json": { schema: ToneRequest } } } },
  responses: { 202: json(ToneResult, "Playing"), ...errors(400, 401, 403, 409) },
});

function serverTiming(phases: Array<[string, number]>): string {
  return phases.map(([name, ms]) => `${name};dur=${ms.toFixed(2)}`).join(", ");
}

/** `POST /webrtc/v1/offer` (every check in the contract's order) and the tone trigger. */
export function registerWebRtcRoutes(app: App, domain: Domain, callers: Callers, webrtc: WebRtcPort): void {
  app.openapi(offerRoute, async (c) => {
    const started = performance.now();
    const phases: Array<[string, number]> = [];
    webrtc.admit?.();
    const type = requestHeader(c, "content-type")?.trim().toLowerCase();
    if (type !== "application/octet-stream") throw new ApiError(415, "UNSUPPORTED_MEDIA_TYPE", "Content-Type must be application/octet-stream");
    const checked = domain.signaling.checkHeaders({
      publicKey: requestHeader(c, "x-giznet-public-key"),
      timestamp: requestHeader(c, "x-giznet-timestamp"),
      nonce: requestHeader(c, "x-giznet-nonce"),
      registrationToken: requestHeader(c, "x-registration-token"),
    });
    // Check 6 comes after the header checks, so the size is checked here rather than by a middleware.
    const body = await readBodyWithin(c.env, OFFER_BODY_LIMIT, 4 * OFFER_BODY_LIMIT);
    if (!body) throw new ApiError(413, "PAYLOAD_TOO_LARGE", `the offer is over ${OFFER_BODY_LIMIT} bytes`);
    const verifyStarted = performance.now();
    const accepted = await domain.signaling.accept(checked, body);
    phases.push(["verify", performance.now() - verifyStarted]);
    const answer = await webrtc.answer(accepted, (phase, ms) => phases.push([phase, ms]), callers.ownAddress(c));
    const sealStarted = performance.now();
    const sealed = accepted.exchange.sealResponse(answer);
    phases.push(["seal", performance.now() - sealStarted], ["total", performance.now() - started]);
    return c.body(new Uint8Array(sealed), 200, { "Content-Type": "application/octet-stream", "Server-Timing": serverTiming(phases) });
  });

  app.openapi({ ...toneRoute, middleware: [jsonBodyLimit, callers.require("primary")] }, async (c) => {
    const hasBody = requestHeader(c, "content-length") !== undefined && requestHeader(c, "content-length") !== "0";
    let body: z.infer<typeof ToneRequest> = {};
    if (hasBody || requestHeader(c, "transfer-encoding")) {
      let value: unknown;
      try {
        value = await c.req.json();
      } catch {
        throw new ApiError(400, "INVALID_REQUEST", "the body is not JSON");
      }
      const parsed = ToneRequest.safeParse(value);
      if (!parsed.success) invalid("INVALID_REQUEST")(parsed);
      body = parsed.data as z.infer<typeof ToneRequest>;
    }
    const key = (c.get("principal") as PrimaryPrincipal).publicKey;
    const played = await webrtc.playTone(key, body.frequency_hz ?? 440, body.duration_ms ?? 1000);
    if (!played) throw new ApiError(409, "NOT_CONNECTED", "the caller has no WebRTC connection");
    return c.json(played, 202);
  });
}
