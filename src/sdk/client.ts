/**
 * The device-side SDK: builds login assertions, logs in, and calls the Public API with the types
 * of the server's own schemas. It imports only crypto and protocol definitions (types).
 */
import { buildAssertion } from "../crypto/assertion.ts";
import { decodeKey, encodeKey, type KeyPair, privateKeyObject, sharedSecret } from "../crypto/keys.ts";
import type {
  AggregateFunction,
  Contact,
  ContactCreate,
  ContactList,
  ContactUpdate,
  DeviceInfo,
  DeviceToken,
  ErrorResponse,
  LoginResult,
  PeerSelf,
  PeerStatus,
  Runtime,
  ServerInfo,
  SideControlSessionList,
  TelemetryAggregate,
  TelemetryField,
  TelemetryLatest,
  TelemetryRange,
  UsageView,
} from "../protocol/public.ts";

/** A non-2xx answer, carrying the contract's error code. */
export class PerchApiError extends Error {
  readonly status: number;
  readonly code: string;
  readonly details?: Record<string, unknown>;
  readonly headers?: Headers;

  constructor(status: number, code: string, message: string, details?: Record<string, unknown>, headers?: Headers) {
    super(`${status} ${code}: ${message}`);
    this.status = status;
    this.code = code;
    this.details = details;
    this.headers = headers;
  }
}

export interface PerchClientOptions {
  /** `http://host:port` of the server. */
  baseUrl: string;
  /** This client's X25519 key pair (a device, or a Side Control controller). */
  keyPair: KeyPair;
  /** Unix milliseconds; inject to build assertions at another time. */
  now?: () => number;
  fetch?: typeof fetch;
}

export type Query = Record<string, string | number | undefined>;

/** The JSON value of `text`, or undefined when it is empty or not JSON. */
function parseJson(text: string): unknown {
  if (!text) return undefined;
  try {
    return JSON.parse(text);
  } catch {
    return undefined;
  }
}

/** The start of a body that is not the contract's error, for a message. */
function summary(text: string, fallback: string): string {
  const flat = text.replace(/\s+/g, " ").trim();
  return flat ? (flat.length > 200 ? `${flat.slice(0, 200)}…` : flat) : fallback || "no body";
}

export class PerchClient {
  readonly baseUrl: string;
  readonly keyPair: KeyPair;
  readonly publicKey: string;
  /** The access token of the last successful login. */
  accessToken: string | undefined;
  private server: { publicKey: Uint8Array; sharedSecret: Uint8Array } | undefined;
  private readonly now: () => number;
  private readonly fetchImpl: typeof fetch;

  constructor(o: PerchClientOptions) {
    this.baseUrl = o.baseUrl.replace(/\/+$/, "");
    this.keyPair = o.keyPair;
    this.publicKey = encodeKey(o.keyPair.publicKey);
    this.now = o.now ?? Date.now;
    this.fetchImpl = o.fetch ?? fetch;
  }

  /** Sends a request and decodes the JSON answer; throws `PerchApiError` for an error status. */
  async request<T>(
    method: string,
    path: string,
    o: { body?: unknown; query?: Query; headers?: Record<string, string>; bearer?: string | null } = {},
  ): Promise<T> {
    const url = new URL(this.baseUrl + path);
    for (const [k, v] of Object.entries(o.query ?? {})) if (v !== undefined) url.searchParams.set(k, String(v));
    const headers: Record<string, string> = { ...o.headers };
    const bearer = o.bearer === undefined ? this.accessToken : o.bearer;
    if (bearer) headers.authorization = `Bearer ${bearer}`;
    if (o.body !== undefined) headers["content-type"] = "application/json";
    const res = await this.fetchImpl(url, { method, headers, body: o.body === undefined ? null : JSON.stringify(o.body) });
    if (res.status === 204) return undefined as T;
    const text = await res.text();
    const value = parseJson(text);
    if (!res.ok) {
      // Not always the server's own answer: a proxy in between may send HTML, or nothing.
      const error = (value as ErrorResponse | undefined)?.error;
      const message = typeof error?.message === "string" ? error.message : summary(text, res.statusText);
      throw new PerchApiError(res.status, typeof error?.code === "string" ? error.code : "UNKNOWN", message, error?.details, res.headers);
    }
    if (value === undefined && text !== "") {
      throw new PerchApiError(res.status, "INVALID_RESPONSE", `the answer is not JSON: ${summary(text, "")}`, undefined, res.headers);
    }
    return value as T;
  }

  serverInfo(): Promise<ServerInfo> {
    return this.request("GET", "/server-info", { bearer: null });
  }

  /** The server's public key (fetched once from `/server-info`) and this key's shared secret with it. */
  private async serverKeys(): Promise<{ publicKey: Uint8Array; sharedSecret: Uint8Array }> {
    if (!this.server) {
      const publicKey = decodeKey((await this.serverInfo()).public_key);
      this.server = { publicKey, sharedSecret: sharedSecret(privateKeyObject(this.keyPair.privateKey), publicKey) };
    }
    return this.server;
  }

  /** A fresh `X25519-HS256` login assertion for this key. */
  async assertion(o: { lifetimeSeconds?: number; nonce?: string; nowSeconds?: number } = {}): Promise<string> {
    const server = await this.serverKeys();
    return buildAssertion({
      clientPublicKey: this.keyPair.publicKey,
      serverPublicKey: server.publicKey,
      sharedSecret: server.sharedSecret,
      now: o.nowSeconds ?? Math.floor(this.now() / 1000),
      ...(o.lifetimeSeconds !== undefined ? { lifetimeSeconds: o.lifetimeSeconds } : {}),
      ...(o.nonce !== undefined ? { nonce: o.nonce } : {}),
    });
  }

  /** Logs in: a primary session, or with `deviceToken` a Side Control session for that token's device. */
  async login(o: { deviceToken?: string; registrationToken?: string; assertion?: string } = {}): Promise<LoginResult> {
    const headers: Record<string, string> = { "x-public-key": this.publicKey };
    if (o.registrationToken) headers["x-registration-token"] = o.registrationToken;
    const body = o.deviceToken ? { grant_type: "side_control", device_token: o.deviceToken } : { grant_type: "primary" };
    const result = await this.request<LoginResult>("POST", "/login", { body, headers, bearer: o.assertion ?? (await this.assertion()) });
    this.accessToken = result.access_token;
    return result;
  }

  // Primary session: the device itself.
  me(): Promise<PeerSelf> {
    return this.request("GET", "/me");
  }
  status(): Promise<PeerStatus> {
    return this.request("GET", "/me/status");
  }
  putStatus(status: PeerStatus): Promise<PeerStatus> {
    return this.request("PUT", "/me/status", { body: status });
  }
  usage(): Promise<UsageView> {
    return this.request("GET", "/me/usage");
  }
  runtime(): Promise<Runtime> {
    return this.request("GET", "/me/runtime");
  }
  createDeviceToken(): Promise<DeviceToken> {
    return this.request("POST", "/me/side-control/device-tokens");
  }
  revokeDeviceToken(id: string): Promise<void> {
    return this.request("DELETE", `/me/side-control/device-tokens/${encodeURIComponent(id)}`);
  }
  sideControlSessions(): Promise<SideControlSessionList> {
    return this.request("GET", "/me/side-control/sessions");
  }
  revokeSideControlSession(id: string): Promise<void> {
    return this.request("DELETE", `/me/side-control/sessions/${encodeURIComponent(id)}`);
  }

  // Side Control session: the target device.
  readonly sideControl = {
    info: (): Promise<DeviceInfo> => this.request("GET", "/side-control/info"),
    runtime: (): Promise<Runtime> => this.request("GET", "/side-control/runtime"),
    usage: (): Promise<UsageView> => this.request("GET", "/side-control/usage"),
    status: (): Promise<PeerStatus> => this.request("GET", "/side-control/status"),
    /** Ends this Side Control session on the server (the bearer stops working, its event streams end). */
    endSession: (): Promise<void> => this.request("DELETE", "/side-control/session"),
    telemetryLatest: (fields?: TelemetryField[]): Promise<TelemetryLatest> =>
      this.request("GET", "/side-control/telemetry/latest", { query: { fields: fields?.join(",") } }),
    telemetry: (q: {
      field: TelemetryField;
      start_time_ms?: number;
      end_time_ms?: number;
      step_ms?: number;
      limit?: number;
      order?: "asc" | "desc";
    }): Promise<TelemetryRange> => this.request("GET", "/side-control/telemetry", { query: q }),
    telemetryAggregate: (q: {
      field: TelemetryField;
      start_time_ms?: number;
      end_time_ms?: number;
      bucket_ms: number;
      aggregate: AggregateFunction;
    }): Promise<TelemetryAggregate> => this.request("GET", "/side-control/telemetry/aggregate", { query: q }),
    contacts: {
      list: (q: { cursor?: string; limit?: number } = {}): Promise<ContactList> => this.request("GET", "/side-control/contacts", { query: q }),
      create: (c: ContactCreate): Promise<Contact> => this.request("POST", "/side-control/contacts", { body: c }),
      get: (name: string): Promise<Contact> => this.request("GET", `/side-control/contacts/${encodeURIComponent(name)}`),
      update: (name: string, c: ContactUpdate): Promise<Contact> => this.request("PUT", `/side-control/contacts/${encodeURIComponent(name)}`, { body: c }),
      delete: (name: string): Promise<Contact> => this.request("DELETE", `/side-control/contacts/${encodeURIComponent(name)}`),
    },
  };
}
