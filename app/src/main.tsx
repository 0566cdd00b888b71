import { render } from "preact";
import { useEffect, useState } from "preact/hooks";
import "./styles.css";
import { forgetSession, unpair } from "./api.ts";
import { startLive } from "./live.ts";
import { ended, link, linkPending, session } from "./state.ts";
import { Contacts } from "./views/Contacts.tsx";
import { Conversations } from "./views/Conversations.tsx";
import { DeviceCard } from "./views/DeviceCard.tsx";
import { Memory } from "./views/Memory.tsx";
import { Pairing } from "./views/Pairing.tsx";
import { Telemetry } from "./views/Telemetry.tsx";

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
  return (
    <>
      <LinkState />
      <DeviceCard />
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

// A link's token replaces a pairing this browser already had; it is tried once.
if (linkToken) {
  forgetSession();
  session.value = undefined;
  linkPending.value = true;
}

const root = document.getElementById("root");
if (root) {
  root.textContent = "";
  render(<App />, root);
}
