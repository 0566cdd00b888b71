import type { Context, MiddlewareHandler } from "hono";
import proxyAddr from "proxy-addr";
import { DomainError } from "../domain/errors.ts";
import type { Domain } from "../domain/index.ts";
import type { Principal } from "../domain/principal.ts";
import { connectionOf } from "./connection.ts";
import type { AppBindings, AppEnv } from "./env.ts";
import { nodeHeader, requestHeader } from "./headers.ts";
import { asMiddleware, type Guard } from "./native.ts";

const BEARER = /^Bearer +(\S+)$/i;

/** The token of an `Authorization: Bearer …` header, if that is what it holds. */
export function bearerToken(authorization: string | undefined): string | undefined {
  return authorization ? BEARER.exec(authorization)?.[1] : undefined;
}

/**
 * Who is calling, and from where: the one place every surface asks. The principal is, in this
 * order, the one bound to the connection the request arrived on (a DataChannel stream, with no
 * bearer), then a bearer: an operator API key (only where `apiKeys` is asked for: the Compatible
 * API) or a session. API keys are looked up before sessions because they live in memory, and a
 * bearer cannot be both, so the order changes only the cost.
 */
export class Callers {
  private readonly domain: Domain;
  /** Whether an address is a proxy whose `X-Forwarded-For` entry is believed; undefined when none is. */
  private readonly trusted: ((address: string, hop: number) => boolean) | undefined;

  constructor(domain: Domain, trustedProxies: readonly string[]) {
    this.domain = domain;
    this.trusted = trustedProxies.length > 0 ? proxyAddr.compile([...trustedProxies]) : undefined;
  }

  principal(c: Context<AppEnv>, o: { apiKeys?: boolean } = {}): Promise<Principal> {
    return this.principalOf(c.env, (name) => requestHeader(c, name), o);
  }

  /** `principal` of a request known by its bindings and its headers (lower-case names). */
  principalOf(env: AppBindings | undefined, header: (name: string) => string | undefined, o: { apiKeys?: boolean } = {}): Promise<Principal> {
    const publicKey = header("x-public-key");
    const connection = connectionOf(env);
    if (connection) return this.domain.auth.authenticateConnection(connection.peerKey, publicKey);
    const bearer = bearerToken(header("authorization"));
    try {
      const apiKey = o.apiKeys && bearer ? this.domain.apiKeys.authenticate(bearer) : undefined;
      if (apiKey) return Promise.resolve(apiKey);
    } catch (err) {
      return Promise.reject(err);
    }
    return this.domain.auth.authenticate(bearer, publicKey);
  }

  /**
   * The client's address, for per-address limits and logs: the connection's; else the socket's,
   * or behind trusted proxies the hop the nearest untrusted one appended to `X-Forwarded-For`
   * (entries a client writes itself sit further left and are never reached).
   */
  address(c: Context<AppEnv>): string {
    let address = c.get("clientAddress");
    if (address === undefined) {
      address = this.resolveAddress(c.env);
      c.set("clientAddress", address);
    }
    return address;
  }

  /**
   * The client's address where it is surely the client's own: undefined for a forwarded request
   * when no proxy is trusted (`address` is then the proxy's, an address the client does not own).
   */
  ownAddress(c: Context<AppEnv>): string | undefined {
    const headers = connectionOf(c.env) ? undefined : c.env?.incoming?.headers;
    if (!this.trusted && headers && (headers["x-forwarded-for"] !== undefined || headers.forwarded !== undefined)) return undefined;
    return this.address(c);
  }

  /** `address` of a request known by its bindings. */
  resolveAddress(env: AppBindings | undefined): string {
    const connection = connectionOf(env);
    if (connection) return connection.remoteAddress;
    const incoming = env?.incoming;
    if (!incoming) return "unknown";
    if (this.trusted) return proxyAddr(incoming, this.trusted);
    return incoming.socket.remoteAddress ?? "unknown";
  }

  /** A guard: resolves the caller's principal (`Exchange.principal`) and requires it to be of `kind`. */
  guard(kind: "primary" | "side_control"): Guard {
    return (x) =>
      this.principalOf(x.env, (name) => nodeHeader(x.incoming, name)).then((principal) => {
        x.principal = requireKind(principal, kind);
      });
  }

  /** `guard` as middleware (`c.get("principal")`). */
  require(kind: "primary" | "side_control"): MiddlewareHandler<AppEnv> {
    return asMiddleware(this.guard(kind));
  }
}

function requireKind(principal: Principal, kind: "primary" | "side_control"): Principal {
  if (principal.kind === kind) return principal;
  throw kind === "primary"
    ? new DomainError("forbidden", "PRIMARY_SESSION_REQUIRED", "this route needs a primary session")
    : new DomainError("forbidden", "SIDE_CONTROL_SESSION_REQUIRED", "this route needs a Side Control session");
}
