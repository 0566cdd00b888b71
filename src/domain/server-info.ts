import { createHmac } from "node:crypto";
import type { ServerInfo } from "../protocol/public.ts";
import type { DomainContext } from "./context.ts";

export const TURN_CREDENTIAL_TTL_S = 600;

export interface ServerIdentity {
  version: string;
  buildCommit: string;
  /** The ICE transports this node answers offers with; none until the WebRTC transport runs here. */
  ice: { udp: boolean; tcp: boolean };
}

/** `GET /server-info`: who this server is and how to reach it. TURN credentials are minted per call. */
export function serverInfo(ctx: DomainContext, identity: ServerIdentity, endpoint: string): ServerInfo {
  const now = ctx.clock.now();
  const info: ServerInfo = {
    public_key: ctx.serverKey.publicKeyText,
    server_time: now,
    version: identity.version,
    build_commit: identity.buildCommit,
    protocol: "gizclaw-webrtc",
    signaling_path: "/webrtc/v1/offer",
    endpoint,
    ice: identity.ice,
  };
  const servers = ctx.config.ice.servers;
  if (servers.length > 0) {
    info.ice_servers = servers.map((s) => {
      if (s.secret) {
        const expiry = Math.floor(now / 1000) + TURN_CREDENTIAL_TTL_S;
        const username = s.name ? `${expiry}:${s.name}` : String(expiry);
        return { urls: s.urls, username, credential: createHmac("sha1", s.secret).update(username).digest("base64") };
      }
      const out: { urls: string[]; username?: string; credential?: string } = { urls: s.urls };
      if (s.username !== undefined) out.username = s.username;
      if (s.credential !== undefined) out.credential = s.credential;
      return out;
    });
  }
  return info;
}
