import { NODE_BEAT_MS, NODE_STALE_MS } from "../domain/presence.ts";

/** The transport's timings, from configuration (`webrtc.*Ms`). */
export interface TransportTimings {
  ownershipCheckMs: number;
  runtimeRefreshMs: number;
  gatherTimeoutMs: number;
  livenessQuietMs: number;
  livenessProbeTimeoutMs: number;
  /** Time for a whole Peer RPC request on stream 0; its stream is closed after it. */
  rpcRequestTimeoutMs: number;
}

/** The contract keeps rx/tx bytes current at least this often. */
const CONTRACT_REFRESH_MS = 10_000;

/**
 * Refuses timings that contradict each other, at start, with a message naming them: a peer is
 * online while its node's heartbeat is younger than the staleness window, so the window must
 * outlast the heartbeat interval (twice over: one late beat must not mark a live node's peers
 * offline); the runtime refresh must keep the contract's 10 s; replacement across nodes must be
 * noticed within the staleness window.
 */
export function checkTimings(t: TransportTimings, presence = { beatMs: NODE_BEAT_MS, staleMs: NODE_STALE_MS }): void {
  const problems: string[] = [];
  if (presence.staleMs <= 2 * presence.beatMs) {
    problems.push(`the runtime's staleness window (${presence.staleMs} ms) must exceed twice the node heartbeat interval (${presence.beatMs} ms)`);
  }
  if (t.runtimeRefreshMs > CONTRACT_REFRESH_MS)
    problems.push(`webrtc.runtime_refresh_ms (${t.runtimeRefreshMs}) must be at most ${CONTRACT_REFRESH_MS} ms (transport contract)`);
  if (t.ownershipCheckMs >= presence.staleMs) {
    problems.push(`webrtc.ownership_check_ms (${t.ownershipCheckMs}) must be shorter than the runtime's staleness window (${presence.staleMs} ms)`);
  }
  if (problems.length > 0) throw new Error(`inconsistent WebRTC timings: ${problems.join("; ")}`);
}
