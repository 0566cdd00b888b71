import { render } from "preact";
import { useEffect, useState } from "preact/hooks";
import "./styles.css";
import { endOnServer, pair, unpair } from "./api.ts";
import { startLive } from "./live.ts";
import { ended, link, linkNotice, linkPending, session } from "./state.ts";
import { Contacts } from "./views/Contacts.tsx";
import { Conversations } from "./views/Conversations.tsx";
import { DeviceCard } from "./views/DeviceCard.tsx";
import { Memory } from "./views/Memory.tsx";
import { explain, Pairing } from "./views/Pairing.tsx";
import { Telemetry } from "./views/Telemetry.tsx";
import { Today } from "./views/Today.tsx";

/** A token handed over in the link (`/app/#token=…`): taken once, then removed from the address bar and history. */
function tokenFromLink(): string {
  const token = new URLSearchParams(location.hash.slice(1)).get("token") ?? "";
  if (location.hash) history.replaceState(null, "", location.pathname + location.search);
  return token.trim();
}

const linkToken = tokenFromLink();

function LinkState() {
  const l = link.value;
  const text =
    l.state === "live"
      ? "Live"
      : l.state === "connecting"
        ? "Connecting…"
        : `Reconnecting in ${Math.max(1, Math.round(((l.retryAt ?? Date.now()) - Date.now()) / 1000))} s: ${l.reason ?? "connection lost"}`;
  return (
    <p class={`link ${l.state}`} role="status" aria-live="polite">
      {text}
    </p>
  );
}

function Paired({ bearer }: { bearer: string }) {
  const [unpairing, setUnpairing] = useState<"idle" | "busy" | "failed">("idle");
  const forget = async () => {
    setUnpairing("busy");
    if (!(await unpair(bearer))) {
      setUnpairing("failed");
      return;
    }
    ended.value = undefined;
    session.value = undefined;
  };
  const notice = linkNotice.value;
  return (
    <>
      {notice && (
        <div class="notice" role="alert">
          <p>{notice}</p>
          <button type="button" class="secondary" onClick={() => (linkNotice.value = undefined)}>
            OK
          </button>
        </div>
      )}
      <LinkState />
      <DeviceCard />
      <Today bearer={bearer} />
      <Conversations bearer={bearer} />
      <Memory bearer={bearer} />
      <Telemetry bearer={bearer} />
      <Contacts bearer={bearer} />
      <p class="unpair">
        <button type="button" class="secondary" disabled={unpairing === "busy"} onClick={() => void forget()}>
          Forget this device
        </button>
      </p>
      {unpairing === "failed" && (
        <p class="error" role="alert">
          The server could not be reached, so the pairing was not ended. Try again.
        </p>
      )}
    </>
  );
}

function App() {
  const s = session.value;
  useEffect(() => (s ? startLive(s) : undefined), [s]);
  const pairing = !s;
  return (
    <>
      <header class="top">
        <h1>Perch</h1>
      </header>
      <main>
        {pairing ? (
          <Pairing initialToken={linkPending.value ? linkToken : ""} autoPair={linkPending.value} />
        ) : (
          <Paired bearer={(s as { access_token: string }).access_token} />
        )}
      </main>
    </>
  );
}

/**
 * A link opened on a phone that is already paired: its token is tried once, and only a pairing it
 * makes replaces the one the phone has (which then ends on the server). A used, expired or wrong
 * link leaves the phone on its device and says why it was not used.
 */
async function pairFromLink(token: string): Promise<void> {
  const before = session.value;
  try {
    const s = await pair(token);
    ended.value = undefined;
    linkNotice.value = undefined;
    session.value = s;
    if (before && before.access_token !== s.access_token) await endOnServer(before.access_token);
  } catch (err) {
    // pair() stores nothing when it fails: the pairing this phone had is untouched.
    if (session.value === before) linkNotice.value = `The pairing link was not used: ${explain(err)} This phone stays paired with its device.`;
  }
}

if (linkToken) {
  if (session.value) void pairFromLink(linkToken);
  else linkPending.value = true;
}

const root = document.getElementById("root");
if (root) {
  root.textContent = "";
  render(<App />, root);
}
