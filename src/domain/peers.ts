import type { DeviceInfo, PeerSelf, PeerStatus, Runtime } from "../protocol/public.ts";
import type { PeerRow } from "../store/peers.ts";
import type { RuntimeRow } from "../store/runtime.ts";
import { newPeer } from "./auth.ts";
import type { DomainContext } from "./context.ts";
import { DomainError } from "./errors.ts";
import { NODE_STALE_MS } from "./presence.ts";

/** Peers: registration, the self view, status documents and runtime. */
export class PeerService {
  private readonly ctx: DomainContext;
  /** Told of each peer this node removed, once its removal committed. */
  private readonly removedListeners: Array<(key: string) => void> = [];

  constructor(ctx: DomainContext) {
    this.ctx = ctx;
  }

  async self(publicKey: string): Promise<PeerSelf> {
    const peer = await this.ctx.store.read((r) => r.peers.get(publicKey));
    if (!peer) throw new DomainError("not_found", "PEER_NOT_FOUND", "this key was never registered");
    return selfView(peer);
  }

  async deviceInfo(publicKey: string): Promise<DeviceInfo> {
    const peer = await this.ctx.store.read((r) => r.peers.get(publicKey));
    if (!peer) throw new DomainError("not_found", "PEER_NOT_FOUND", "this key was never registered");
    return JSON.parse(peer.device_info) as DeviceInfo;
  }

  /**
   * Merges what a connected device reported (`client.info.get`, `client.identifiers.get`,
   * `server.info.put`) into its stored DeviceInfo, field by field; returns the result.
   */
  async mergeDeviceInfo(publicKey: string, patch: DeviceInfo): Promise<DeviceInfo> {
    return this.ctx.store.transaction(async (tx) => {
      await tx.peers.lock(publicKey);
      const peer = await tx.peers.get(publicKey);
      if (!peer) throw new DomainError("not_found", "PEER_NOT_FOUND", "this key was never registered");
      const next: DeviceInfo = { ...(JSON.parse(peer.device_info) as DeviceInfo) };
      for (const [k, v] of Object.entries(patch)) if (v !== undefined) (next as Record<string, unknown>)[k] = v;
      await tx.peers.setDeviceInfo(publicKey, JSON.stringify(next), this.ctx.clock.now());
      return next;
    });
  }

  async status(publicKey: string): Promise<PeerStatus> {
    return ((await this.ctx.store.read((r) => r.status.get(publicKey))) ?? {}) as PeerStatus;
  }

  /** The status document as JSON text (`{}` when none): what `GET …/status` answers, without parsing and serialising it again. */
  statusText(publicKey: string): Promise<string> {
    return this.ctx.store.read((r) => r.status.getText(publicKey)).then((text) => text ?? "{}");
  }

  /** Replaces the status document; `reported_at` defaults to now. */
  async putStatus(publicKey: string, status: PeerStatus): Promise<PeerStatus> {
    const now = this.ctx.clock.now();
    const document: PeerStatus = { ...status, reported_at: status.reported_at ?? new Date(now).toISOString() };
    await this.ctx.store.transaction((tx) => tx.status.put(publicKey, document, now));
    this.ctx.events.status(publicKey, document, now);
    return document;
  }

  async runtime(publicKey: string): Promise<Runtime> {
    return (await this.runtimeUntil(publicKey)).runtime;
  }

  /** The runtime, and while it says online the time it turns offline unless the peer's node beats again. */
  async runtimeUntil(publicKey: string): Promise<{ runtime: Runtime; offlineAt?: number }> {
    const row = await this.ctx.store.read((r) => r.runtime.getWithBeat(publicKey));
    if (!row) return { runtime: { online: false } };
    const runtime = runtimeView(row, this.ctx.clock.now());
    return runtime.online && row.beat_at !== null ? { runtime, offlineAt: Number(row.beat_at) + NODE_STALE_MS } : { runtime };
  }

  /** When the peers recorded online on `node` turn offline unless it beats again; undefined once it stopped beating for good (it left). */
  async nodeOfflineAt(node: string): Promise<number | undefined> {
    const beat = await this.ctx.store.read((r) => r.runtime.beatAt(node));
    return beat === undefined ? undefined : beat + NODE_STALE_MS;
  }

  // Operator actions (command line).

  list(): Promise<PeerRow[]> {
    return this.ctx.store.read((r) => r.peers.list());
  }

  /** Registers a key (any policy); returns false when it was already registered. */
  async add(publicKey: string, role: "client" | "admin" = "client"): Promise<boolean> {
    return this.ctx.store.transaction((tx) => tx.peers.register(newPeer(publicKey, this.ctx.clock.now(), role)));
  }

  /** Every node holding the peer's connection or its sessions' streams hears of it (`topics.peers`), whichever process runs this. */
  async setBlocked(publicKey: string, blocked: boolean): Promise<boolean> {
    const publish = await this.ctx.store.transaction(async (tx) =>
      (await tx.peers.setStatus(publicKey, blocked ? "blocked" : "active", this.ctx.clock.now()))
        ? this.ctx.events.peer(tx, publicKey, blocked ? "blocked" : "unblocked")
        : undefined,
    );
    publish?.();
    return publish !== undefined;
  }

  /** The device's voice agent: an agent id, `off`, or null for the configured default (`voice.agent`); a live conversation on any node takes it (`topics.peers`). */
  async setVoiceAgent(publicKey: string, voiceAgent: string | null): Promise<boolean> {
    const publish = await this.ctx.store.transaction(async (tx) =>
      (await tx.peers.setVoiceAgent(publicKey, voiceAgent, this.ctx.clock.now())) ? this.ctx.events.voiceAgent(tx, publicKey, voiceAgent) : undefined,
    );
    publish?.();
    return publish !== undefined;
  }

  /** The stored voice agent setting; undefined when the key is not registered. */
  voiceAgent(publicKey: string): Promise<string | null | undefined> {
    return this.ctx.store.read((r) => r.peers.voiceAgent(publicKey));
  }

  async remove(publicKey: string): Promise<boolean> {
    const publish = await this.ctx.store.transaction(async (tx) => {
      // Its memory first, overwritten in the file (the cascade would leave the text in free space).
      await tx.memories.delete(publicKey);
      const recordings = await tx.recordings.deleteDevice(publicKey);
      await tx.usage.removePrincipal(`device:${publicKey}`);
      const removed = (await tx.peers.remove(publicKey)) ? await this.ctx.events.peer(tx, publicKey, "removed") : undefined;
      return removed && { removed, recordings };
    });
    // Best effort: the peer is gone either way, and SQLite checkpoints on its own later.
    if (publish) await this.ctx.store.truncateLogSoon().catch(() => false);
    if (publish && publish.recordings > 0) await this.ctx.store.eraseDeletedRecordings().catch(() => {});
    publish?.removed();
    if (publish) for (const l of this.removedListeners) l(publicKey);
    return publish !== undefined;
  }

  /** `listener` hears of each peer this node removed, once the removal committed. */
  onRemoved(listener: (key: string) => void): void {
    this.removedListeners.push(listener);
  }
}

function selfView(peer: PeerRow): PeerSelf {
  return {
    public_key: peer.public_key,
    role: peer.role as PeerSelf["role"],
    registration_status: peer.status as PeerSelf["registration_status"],
    device: JSON.parse(peer.device_info) as DeviceInfo,
    created_at: peer.created_at,
  };
}

/** Online when recorded so on a node whose heartbeat is fresh (a node that died stops beating). */
function runtimeView(row: RuntimeRow & { beat_at: number | null }, now: number): Runtime {
  const view: Runtime = { online: row.online === 1 && row.beat_at !== null && now - row.beat_at < NODE_STALE_MS };
  if (row.last_seen_at !== null) view.last_seen_at = new Date(row.last_seen_at).toISOString();
  if (row.last_addr !== null) view.last_addr = row.last_addr;
  if (row.rx_bytes !== null) view.rx_bytes = row.rx_bytes;
  if (row.tx_bytes !== null) view.tx_bytes = row.tx_bytes;
  if (row.node !== null) view.node = row.node;
  return view;
}
