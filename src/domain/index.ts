import { ApiKeyService } from "./api-keys.ts";
import { AuthService } from "./auth.ts";
import { ContactService } from "./contacts.ts";
import type { DomainContext } from "./context.ts";
import { ConversationService } from "./conversations.ts";
import { StoreUnavailable } from "./errors.ts";
import { type LiveOptions, LiveService } from "./live.ts";
import { MemoryService } from "./memory.ts";
import { NodeService } from "./nodes.ts";
import { PeerService } from "./peers.ts";
import { PresenceService } from "./presence.ts";
import { SideControlService } from "./side-control.ts";
import { SignalingService } from "./signaling.ts";
import { TelemetryService } from "./telemetry.ts";
import { UsageService } from "./usage.ts";

export type { DomainContext } from "./context.ts";
export { DomainError, StoreUnavailable } from "./errors.ts";
export type { Principal } from "./principal.ts";

/** Perch's domain: every rule, no HTTP. Transports call it; it calls the store. */
export class Domain {
  readonly auth: AuthService;
  readonly apiKeys: ApiKeyService;
  readonly peers: PeerService;
  readonly sideControl: SideControlService;
  readonly telemetry: TelemetryService;
  readonly contacts: ContactService;
  readonly conversations: ConversationService;
  readonly memory: MemoryService;
  readonly signaling: SignalingService;
  readonly presence: PresenceService;
  readonly live: LiveService;
  readonly nodes: NodeService;
  readonly usage: UsageService;

  readonly ctx: DomainContext;

  constructor(ctx: DomainContext, o: { live?: LiveOptions } = {}) {
    this.ctx = ctx;
    this.auth = new AuthService(ctx);
    this.apiKeys = new ApiKeyService(ctx);
    this.peers = new PeerService(ctx);
    this.sideControl = new SideControlService(ctx);
    this.telemetry = new TelemetryService(ctx);
    this.contacts = new ContactService(ctx);
    this.conversations = new ConversationService(ctx);
    this.memory = new MemoryService(ctx);
    this.signaling = new SignalingService(ctx, this.auth);
    this.presence = new PresenceService(ctx);
    this.live = new LiveService(ctx, this.peers, o.live);
    this.nodes = new NodeService(ctx);
    this.usage = new UsageService(ctx);
    this.peers.onRemoved((key) => this.usage.meter.forgetDevice(key, true));
  }

  /** Readiness: the store answers within `timeoutMs`; else `StoreUnavailable`. */
  async ready(timeoutMs: number): Promise<void> {
    let timer: NodeJS.Timeout | undefined;
    const late = new Promise<never>((_, reject) => {
      timer = setTimeout(() => reject(new StoreUnavailable(`the store did not answer within ${timeoutMs} ms`)), timeoutMs);
    });
    try {
      await Promise.race([this.ctx.store.ping(), late]);
    } catch (err) {
      throw err instanceof StoreUnavailable ? err : new StoreUnavailable("the store does not answer", { cause: err });
    } finally {
      clearTimeout(timer);
    }
  }
}
