/** The offer checks of the contract (checks 10 and 11) and the answer's host candidates. */

export interface OfferShape {
  audioMid: string;
  opusPayloadType: number;
}

export type OfferProblem = "INVALID_SDP" | "MISSING_OPUS_AUDIO";

/** What the answerer needs from a valid offer, or the contract's code for an invalid one. */
export function inspectOffer(sdp: string): OfferShape | OfferProblem {
  const lines = sdp.split(/\r?\n/);
  if (!lines[0]?.startsWith("v=0") || !lines.some((l) => l.startsWith("a=fingerprint:"))) return "INVALID_SDP";
  const sections: string[][] = [];
  const session: string[] = [];
  for (const line of lines) {
    if (line.startsWith("m=")) sections.push([line]);
    else (sections.at(-1) ?? session).push(line);
  }
  const sessionDirection = direction(session);
  let audio: OfferShape | undefined;
  let data = false;
  for (const section of sections) {
    const m = /^m=(\w+) \d+ (\S+)(?: (.*))?$/.exec(section[0]!);
    if (!m) return "INVALID_SDP";
    const [, kind, proto, formats = ""] = m;
    if (kind === "application" && /DTLS\/SCTP/.test(proto!) && formats.split(" ").includes("webrtc-datachannel")) data = true;
    if (kind !== "audio" || audio) continue;
    if ((direction(section) ?? sessionDirection ?? "sendrecv") !== "sendrecv") continue;
    const mid = section
      .find((l) => l.startsWith("a=mid:"))
      ?.slice(6)
      .trim();
    const opus = section.map((l) => /^a=rtpmap:(\d+) opus\/48000(\/\d+)?\s*$/i.exec(l)).find((x) => x);
    if (mid && opus && formats.split(" ").includes(opus[1]!)) audio = { audioMid: mid, opusPayloadType: Number(opus[1]) };
  }
  return audio && data ? audio : "MISSING_OPUS_AUDIO";
}

function direction(lines: string[]): string | undefined {
  return lines
    .find((l) => /^a=(sendrecv|sendonly|recvonly|inactive)\s*$/.test(l))
    ?.slice(2)
    .trim();
}

/** Replaces the address of every host candidate with `address` (dropping the duplicates that makes). */
export function rewriteHostCandidates(sdp: string, address: string | undefined): string {
  if (!address) return sdp;
  const seen = new Set<string>();
  const out: string[] = [];
  for (const line of sdp.split("\r\n")) {
    const m = /^(a=candidate:\S+ \d+ \S+ \d+ )(\S+)( \d+ typ host.*)$/.exec(line);
    if (!m) {
      out.push(line);
      continue;
    }
    const rewritten = `${m[1]}${address}${m[3]}`;
    const key = `${address}${m[3]}`;
    if (seen.has(key)) continue;
    seen.add(key);
    out.push(rewritten);
  }
  return out.join("\r\n");
}
