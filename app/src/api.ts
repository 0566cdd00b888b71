import { assertion, controllerKey, encodeKey } from "./crypto.ts";

/** An error answer of the API (`{error: {code, message, details}}`), or the network failing (`status` 0). */
export class ApiError extends Error {
  readonly status: number;
  readonly code: string;
  readonly details: Record<string, unknown> | undefined;
  /** The bearer the failed request carried: a 401 for a pairing already replaced must not end the new one. */
  bearer: string | undefined;
  constructor(status: number, code: string, message: string, details?: Record<string, unknown>) {
    super(message);
    this.status = status;
    this.code = code;
    this.details = details;
  }
  /** The field the error is about, when the server named one. */
  get field(): string | undefined {
    const f = this.details?.field;
    return typeof f === "string" ? f : undefined;
  }
}

export interface Session {
  access_token: string;
  session_id: string;
  expires_at: number;
}

const SESSION = "perch.session";

export function storedSession(): Session | undefined {
  try {
    const s = JSON.parse(localStorage.getItem(SESSION) ?? "null") as Session | null;
    return s && typeof s.access_token === "string" ? s : undefined;
  } catch {
    return undefined;
  }
}

export function forgetSession(): void {
  localStorage.removeItem(SESSION);
}

/**
 * "Forget this device": the session ends on the server (`DELETE /side-control/session`), then here.
 * False when the server could not end it (unreachable, or unavailable): the pairing is kept, so
 * that forgetting never leaves a bearer valid on the server unknowingly. A 401 or 403 means it is
 * over there already.
 */
export async function unpair(bearer: string): Promise<boolean> {
  try {
    await request("DELETE", "/side-control/session", { bearer });
  } catch (err) {
    if (!(err instanceof ApiError) || err.status === 0 || err.status >= 500) return false;
  }
  forgetSession();
  return true;
}

/** Ends a session on the server only (a pairing replaced by a newer one); what this page stores is left alone. */
export async function endOnServer(bearer: string): Promise<void> {
  await request("DELETE", "/side-control/session", { bearer }).catch(() => {});
}

async function errorOf(res: Response): Promise<ApiError> {
  try {
    const body = (await res.json()) as { error?: { code?: string; message?: string; details?: Record<string, unknown> } };
    if (body.error?.code) return new ApiError(res.status, body.error.code, body.error.message ?? body.error.code, body.error.details);
  } catch {
    // Not our envelope (a proxy's page).
  }
  return new ApiError(res.status, "HTTP_ERROR", `the server answered ${res.status}`);
}

/** A JSON request to this origin; rejects with ApiError (status 0 when the server cannot be reached). */
export async function request<T>(
  method: string,
  path: string,
  o: { bearer?: string; body?: unknown; headers?: Record<string, string>; signal?: AbortSignal } = {},
): Promise<T> {
  const headers: Record<string, string> = { accept: "application/json", ...o.headers };
  if (o.bearer) headers.authorization = `Bearer ${o.bearer}`;
  if (o.body !== undefined) headers["content-type"] = "application/json";
  let res: Response;
  try {
    res = await fetch(path, {
      method,
      headers,
      body: o.body === undefined ? null : JSON.stringify(o.body),
      cache: "no-store",
      ...(o.signal ? { signal: o.signal } : {}),
    });
  } catch (err) {
    if ((err as Error)?.name === "AbortError") throw err;
    throw new ApiError(0, "UNREACHABLE", "the server cannot be reached");
  }
  if (!res.ok) {
    const err = await errorOf(res);
    err.bearer = o.bearer;
    throw err;
  }
  if (res.status === 204) return undefined as T;
  return (await res.json()) as T;
}

/**
 * A binary answer (a recording) as a Blob, fetched with the bearer: a media element cannot send
 * one, so the app plays it from an object URL (which works on a LAN name too, where the page is
 * not a secure context).
 */
export async function fetchBlob(path: string, bearer: string, signal?: AbortSignal): Promise<Blob> {
  let res: Response;
  try {
    res = await fetch(path, { headers: { authorization: `Bearer ${bearer}` }, ...(signal ? { signal } : {}) });
  } catch (err) {
    if ((err as Error)?.name === "AbortError") throw err;
    throw new ApiError(0, "UNREACHABLE", "the server cannot be reached");
  }
  if (!res.ok) {
    const err = await errorOf(res);
    err.bearer = bearer;
    throw err;
  }
  return res.blob();
}

/** Pairs this browser with a device: a Side Control login with the device token. */
export async function pair(deviceToken: string): Promise<Session> {
  const key = await controllerKey();
  const info = await request<{ public_key: string; server_time: number }>("GET", "/server-info");
  const token = await assertion(key, info.public_key, info.server_time);
  const login = await request<Session>("POST", "/login", {
    bearer: token,
    headers: { "x-public-key": encodeKey(key.publicKey) },
    body: { grant_type: "side_control", device_token: deviceToken },
  });
  const session = { access_token: login.access_token, session_id: login.session_id, expires_at: login.expires_at };
  localStorage.setItem(SESSION, JSON.stringify(session));
  return session;
}
