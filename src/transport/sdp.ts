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

/**
 * The offer with candidates only in the BUNDLE group's tagged m-section (the first mid of the
 * group), whose transport is the only one a bundled answer uses (RFC 8843, 7.3.1); unchanged
 * without a group, or when that section lists no candidates.
 *
 * The server's ICE agent (libjuice) checks every remote candidate 50 ms after the previous one,
 * in priority order, and becomes connected on its own successful check even when the device has
 * already nominated a pair. libwebrtc repeats its host candidates for every m-section until the
 * answer bundles them, so on a machine with four interfaces the reachable pair came eighth:
 * about 400 ms of a connect, 200 ms once the repeats are gone.
 */
export function bundledCandidatesOnly(sdp: string): string {
  const tagged = /^a=group:BUNDLE[ \t]+(\S+)/m.exec(sdp)?.[1];
  if (!tagged) return sdp;
  const sections = sdp.split(/(?=^m=)/m);
  const isTagged = (section: string) => section.startsWith("m=") && section.split(/\r?\n/).some((l) => l.trim() === `a=mid:${tagged}`);
  const keep = sections.find(isTagged);
  if (!keep || !/^a=candidate:/m.test(keep)) return sdp;
  return sections.map((section) => (!section.startsWith("m=") || isTagged(section) ? section : section.replace(/^a=candidate:.*(?:\r?\n|$)/gm, ""))).join("");
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
