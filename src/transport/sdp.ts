/** The offer checks of the contract (checks 10 and 11) and the answer's host candidates. */

import { AUDIO_LEVEL_URI } from "../voice/rtp.ts";

export interface OfferShape {
  audioMid: string;
  opusPayloadType: number;
  /** The id the offer gave the audio-level header extension (RFC 6464) in its audio section, when it offered it (1–14). */
  audioLevelId?: number;
}

export interface OfferProblem {
  code: "INVALID_SDP" | "MISSING_OPUS_AUDIO";
  message: string;
}

/** Bounds on what an offer may carry: what the answer echoes (mids, sections) stays small. */
export const OFFER_LIMITS = {
  /** Media sections (libwebrtc offers one per transceiver; a device with 100 must still connect). */
  mediaSections: 128,
  /** Characters of an `a=mid` (RFC 5888 sets none; the answer repeats every mid twice). */
  midChars: 32,
  /** Characters of one SDP line (a BUNDLE group of 128 longest mids fits). */
  lineChars: 8192,
} as const;

/**
 * The largest answer given: the size an offer may have. The WebRTC stack repeats most of each
 * offered section (codecs, header extensions) in the answer, about 1 KB for an audio section of
 * libwebrtc's; an offer that would be answered with more is refused (400 INVALID_SDP).
 */
export const MAX_ANSWER_BYTES = 256 * 1024;

const FINGERPRINT_BYTES: Record<string, number> = { "sha-1": 20, "sha-224": 28, "sha-256": 32, "sha-384": 48, "sha-512": 64 };
const ICE_CHARS = /^[A-Za-z0-9+/]+$/;
const TOKEN = /^[A-Za-z0-9!#$%&'*+\-.^_`{|}~]+$/;
const CANDIDATE =
  /^a=candidate:([A-Za-z0-9+/]{1,32}) (\d{1,3}) (udp|tcp) (\d{1,10}) ([A-Za-z0-9.:\-_%]{1,253}) (\d{1,5}) typ (host|srflx|prflx|relay)(?: [\x21-\x7e]+)*$/i;

/**
 * Why an offer cannot be applied, in words for the device's developer, or undefined when every
 * line the WebRTC stack reads is well-formed: the stack would otherwise throw, or accept values
 * that make the answer grow with the offer. Each check names the line it refused.
 */
export function offerSyntaxProblem(sdp: string): string | undefined {
  const lines = sdp.split(/\r?\n/);
  if (lines.at(-1) === "") lines.pop();
  if (lines[0] !== "v=0") return "the offer must begin with v=0";
  let sections = 0;
  const sessionIce = { ufrag: false, pwd: false };
  /** Each media section's mid, port and ICE credentials. */
  const media: Array<{ mid: string | undefined; port: number; ufrag: boolean; pwd: boolean }> = [];
  let fingerprint = false;
  const mids = new Set<string>();
  const bundle: string[] = [];
  for (const [i, line] of lines.entries()) {
    const where = `line ${i + 1}`;
    if (line.length > OFFER_LIMITS.lineChars) return `${where} is longer than ${OFFER_LIMITS.lineChars} characters`;
    if (!/^[a-z]=/.test(line)) return `${where} is not of the form <letter>=<value>`;
    if (line.startsWith("m=")) {
      sections++;
      if (sections > OFFER_LIMITS.mediaSections) return `the offer has more than ${OFFER_LIMITS.mediaSections} media sections`;
      const m = /^m=([a-z]+) (\d{1,5})(?:\/\d+)? ([A-Za-z0-9/]+)((?: \S+)+)$/.exec(line);
      if (!m || Number(m[2]) > 65535) return `${where}: a malformed m= line`;
      media.push({ mid: undefined, port: Number(m[2]), ufrag: false, pwd: false });
      if (/RTP/.test(m[3]!)) {
        for (const pt of m[4]!.trim().split(" "))
          if (!/^\d{1,3}$/.test(pt) || Number(pt) > 127) return `${where}: payload type ${pt.slice(0, 16)} is not 0–127`;
      }
      continue;
    }
    if (!line.startsWith("a=")) continue;
    const colon = line.indexOf(":");
    const name = colon < 0 ? line.slice(2) : line.slice(2, colon);
    const value = colon < 0 ? "" : line.slice(colon + 1);
    switch (name) {
      case "ice-ufrag":
        if (value.length < 4 || value.length > 256 || !ICE_CHARS.test(value)) return `${where}: ice-ufrag must be 4–256 ICE characters`;
        if (sections === 0) sessionIce.ufrag = true;
        else media[sections - 1]!.ufrag = true;
        break;
      case "ice-pwd":
        if (value.length < 22 || value.length > 256 || !ICE_CHARS.test(value)) return `${where}: ice-pwd must be 22–256 ICE characters`;
        if (sections === 0) sessionIce.pwd = true;
        else media[sections - 1]!.pwd = true;
        break;
      case "fingerprint": {
        const f = /^(\S+) ([0-9A-Fa-f]{2}(?::[0-9A-Fa-f]{2})*)$/.exec(value);
        const bytes = f ? FINGERPRINT_BYTES[f[1]!.toLowerCase()] : undefined;
        if (!f || bytes === undefined || f[2]!.split(":").length !== bytes) return `${where}: a malformed fingerprint`;
        fingerprint = true;
        break;
      }
      case "mid":
        if (value.length === 0 || value.length > OFFER_LIMITS.midChars || !TOKEN.test(value))
          return `${where}: a mid must be 1–${OFFER_LIMITS.midChars} token characters`;
        if (mids.has(value)) return `${where}: mid ${value} is used twice`;
        mids.add(value);
        if (sections > 0) media[sections - 1]!.mid = value;
        break;
      case "group":
        if (value.startsWith("BUNDLE")) bundle.push(...value.slice(6).trim().split(/\s+/).filter(Boolean));
        break;
      case "rtpmap":
      case "fmtp":
      case "rtcp-fb": {
        const pt = /^(\d{1,3}|\*)(?: |$)/.exec(value)?.[1];
        if (pt === undefined || (pt !== "*" && Number(pt) > 127)) return `${where}: payload type out of 0–127`;
        break;
      }
      case "candidate": {
        const c = CANDIDATE.exec(line);
        if (!c || Number(c[2]) < 1 || Number(c[2]) > 256 || Number(c[4]) > 0xffffffff || Number(c[6]) > 65535) return `${where}: a malformed candidate`;
        break;
      }
      case "setup":
        if (!/^(actpass|active|passive|holdconn)$/.test(value)) return `${where}: setup must be actpass, active, passive or holdconn`;
        break;
      case "sctp-port":
      case "max-message-size":
        if (!/^\d{1,10}$/.test(value)) return `${where}: ${name} must be a number`;
        break;
    }
  }
  if (!fingerprint) return "the offer has no a=fingerprint: line";
  for (const mid of bundle) if (!mids.has(mid)) return `the BUNDLE group names mid ${mid.slice(0, OFFER_LIMITS.midChars)}, which no section has`;
  // The transports the answer uses: the BUNDLE group's tagged section, or every section in use.
  const used = bundle.length > 0 ? media.filter((m) => m.mid === bundle[0]) : media.filter((m) => m.port !== 0);
  const bare = used.find((m) => !(m.ufrag || sessionIce.ufrag) || !(m.pwd || sessionIce.pwd));
  if (bare) return `media section ${media.indexOf(bare) + 1} has no a=ice-ufrag and a=ice-pwd (nor has the session)`;
  return undefined;
}

/** What the answerer needs from a valid offer, or the contract's code (and why) for an invalid one. */
export function inspectOffer(sdp: string): OfferShape | OfferProblem {
  const syntax = offerSyntaxProblem(sdp);
  if (syntax) return { code: "INVALID_SDP", message: syntax };
  const lines = sdp.split(/\r?\n/);
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
    if (!m) return { code: "INVALID_SDP", message: "a malformed m= line" };
    const [, kind, proto, formats = ""] = m;
    if (kind === "application" && /DTLS\/SCTP/.test(proto!) && formats.split(" ").includes("webrtc-datachannel")) data = true;
    if (kind !== "audio" || audio) continue;
    if ((direction(section) ?? sessionDirection ?? "sendrecv") !== "sendrecv") continue;
    const mid = section
      .find((l) => l.startsWith("a=mid:"))
      ?.slice(6)
      .trim();
    const opus = section.map((l) => /^a=rtpmap:(\d+) opus\/48000(\/\d+)?\s*$/i.exec(l)).find((x) => x);
    if (mid && opus && formats.split(" ").includes(opus[1]!)) {
      audio = { audioMid: mid, opusPayloadType: Number(opus[1]) };
      const level = audioLevelId(section);
      if (level !== undefined) audio.audioLevelId = level;
    }
  }
  return audio && data
    ? audio
    : { code: "MISSING_OPUS_AUDIO", message: "the offer needs a sendrecv audio section with opus/48000 and a webrtc-datachannel section" };
}

/**
 * The id of the audio-level extension in a media section's `a=extmap` lines: one of the one-byte
 * form (1–14, RFC 8285), which every sender that offers it can use, else none.
 */
function audioLevelId(section: string[]): number | undefined {
  for (const line of section) {
    const m = /^a=extmap:(\d{1,3})(?:\/\w+)? (\S+)\s*$/.exec(line);
    if (m && m[2] === AUDIO_LEVEL_URI && Number(m[1]) >= 1 && Number(m[1]) <= 14) return Number(m[1]);
  }
  return undefined;
}

function direction(lines: string[]): string | undefined {
  return lines
    .find((l) => /^a=(sendrecv|sendonly|recvonly|inactive)\s*$/.test(l))
    ?.slice(2)
    .trim();
}

/**
 * The offer as this server applies it (the device's own description is unchanged): the candidates
 * the server checks at once. Only a libwebrtc device's, on the address its offer came from.
 *
 * The server's ICE agent (libjuice, the controlled agent) is connected only on a check of its own,
 * and it checks the offer's candidates one every 50 ms from the moment it has the offer. Without
 * them it learns the device's address from the device's checks (peer-reflexive: behind a NAT the
 * only address that answers) and its own check goes 50 ms after the device's last one; libwebrtc
 * repeats its check every 48 ms, so that is about 150 ms after the answer. A check of the
 * device's address that goes at once succeeds before the device has the answer, and the server's
 * DTLS ClientHello follows: libwebrtc keeps a ClientHello that arrives before its answer (and
 * checks the fingerprint once it has it), so it is connected about 10 ms after the answer.
 * libdatachannel drops it (its 1 s retransmission), and as the DTLS client against a server that
 * is already connected it fails the handshake about one connect in four (it checks the server's
 * certificate before it has stored the answer's fingerprint): other stacks get no early check.
 * libwebrtc is known by the `network-id` it writes on its candidates.
 *
 * The address is the HTTP client's own (never a proxy's) and the candidate a host one: a device that
 * reached the server with no NAT between (the same host or network). Behind a NAT no host candidate
 * answers (and a server-reflexive one on the NAT's address need not), and each unanswered check would take
 * one of the 50 ms slots the server's own check waits for; only the section whose transport the
 * answer uses counts (the BUNDLE group's tag). An ICE-lite device never checks (RFC 8445 §2.5):
 * its offer is applied as it is, every candidate checked.
 */
export function offerToApply(sdp: string, from: string | undefined): string {
  if (/^a=ice-lite\s*$/m.test(sdp)) return sdp;
  const address = from === undefined ? undefined : comparableAddress(from);
  const lines = sdp.split("\n");
  const used = usedSection(lines);
  let section = -1;
  return lines
    .filter((line) => {
      if (line.startsWith("m=")) section++;
      if (!line.startsWith("a=candidate:")) return true;
      const c = CANDIDATE.exec(line.replace(/\r$/, ""));
      return (
        section === used &&
        c !== null &&
        c[3]!.toLowerCase() === "udp" &&
        c[7]!.toLowerCase() === "host" &&
        / network-id \d+/.test(line) &&
        comparableAddress(c[5]!) === address
      );
    })
    .join("\n");
}

/** The index of the media section whose transport the answer uses: the BUNDLE group's tagged one, else the first. */
function usedSection(lines: string[]): number {
  const tag = lines.map((l) => /^a=group:BUNDLE +(\S+)/.exec(l.replace(/\r$/, ""))?.[1]).find((m) => m !== undefined);
  if (tag === undefined) return 0;
  let section = -1;
  for (const line of lines) {
    if (line.startsWith("m=")) section++;
    else if (section >= 0 && line.replace(/\r$/, "") === `a=mid:${tag}`) return section;
  }
  return 0;
}

/** An address as a candidate and the HTTP socket both may write it: IPv4-mapped IPv6 as IPv4, lower case, no zone. */
function comparableAddress(address: string): string {
  const a = address.toLowerCase().replace(/%.*$/, "");
  return a.startsWith("::ffff:") && a.includes(".") ? a.slice(7) : a;
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
