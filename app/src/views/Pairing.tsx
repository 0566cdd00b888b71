import { useSignal } from "@preact/signals";
import { useEffect } from "preact/hooks";
import { ApiError, pair } from "../api.ts";
import { type Ended, ended, linkPending, session } from "../state.ts";

const ENDED: Record<Ended, string> = {
  revoked: "The device ended this pairing. To watch it again, pair with a new device token from the device.",
  expired: "This pairing expired (pairings last 24 hours). Pair again with a new device token from the device.",
  invalid: "This pairing is no longer valid: it was revoked, expired, or the device was removed. Pair again with a new device token.",
  blocked: "This device (or this phone) is blocked on the server. Ask its operator.",
};

/** Why pairing with a token failed, for the person holding the phone. */
export function explain(err: unknown): string {
  if (!(err instanceof ApiError)) return "Pairing failed in this browser. Try again.";
  switch (err.code) {
    case "INVALID_DEVICE_TOKEN":
      return "That device token is not valid: it may be mistyped, already used, or expired (tokens last 5 minutes). Ask the device for a new one.";
    case "INVALID_REQUEST":
      return "Enter the device token shown by the device.";
    case "PEER_BLOCKED":
      return "This device is blocked on the server.";
    case "RATE_LIMITED":
      return "Too many attempts. Wait a minute and try again.";
    case "UNREACHABLE":
      return "The server cannot be reached. Check the connection and try again.";
    default:
      return err.message;
  }
}

/** Pairing: the device token typed, pasted, or taken from the link (`#token=…`). */
export function Pairing({ initialToken, autoPair }: { initialToken: string; autoPair: boolean }) {
  const token = useSignal(initialToken);
  const error = useSignal<string | undefined>(undefined);
  const busy = useSignal(false);
  const submit = async (e?: Event) => {
    e?.preventDefault();
    const value = token.value.trim();
    if (!value) {
      error.value = "Enter the device token shown by the device.";
      return;
    }
    busy.value = true;
    error.value = undefined;
    linkPending.value = false;
    try {
      const s = await pair(value);
      ended.value = undefined;
      session.value = s;
    } catch (err) {
      error.value = explain(err);
    } finally {
      busy.value = false;
    }
  };
  // A token from the link pairs at once (once per page load).
  useEffect(() => {
    if (autoPair && initialToken) void submit();
  }, []);
  const why = ended.value;
  return (
    <section class="card" aria-labelledby="pair-heading">
      <h2 id="pair-heading">Pair with a device</h2>
      {why && (
        <p class="notice" role="alert">
          {ENDED[why]}
        </p>
      )}
      <form onSubmit={submit} noValidate>
        <label for="device-token">Device token</label>
        <input
          id="device-token"
          name="device-token"
          type="text"
          autoComplete="off"
          autoCapitalize="off"
          spellcheck={false}
          value={token.value}
          onInput={(e) => (token.value = (e.target as HTMLInputElement).value)}
          aria-invalid={error.value ? "true" : "false"}
          aria-describedby="device-token-help device-token-error"
        />
        <p id="device-token-help" class="help">
          The device shows it as text or as a QR code; it works once, within 5 minutes.
        </p>
        <p id="device-token-error" class="error" role="alert">
          {error.value ?? ""}
        </p>
        <button type="submit" disabled={busy.value}>
          {busy.value ? "Pairing…" : "Pair"}
        </button>
      </form>
    </section>
  );
}
