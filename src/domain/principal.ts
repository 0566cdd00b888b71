/** Who is calling, once authenticated. */
export type Principal =
  | { kind: "primary"; publicKey: string; sessionId?: string }
  | { kind: "side_control"; publicKey: string; targetKey: string; sessionId: string; expiresAt: number }
  /** An operator API key (Compatible API only): an application, not a device. */
  | { kind: "api_key"; name: string; models: readonly string[] };

export type PrimaryPrincipal = Extract<Principal, { kind: "primary" }>;
export type SideControlPrincipal = Extract<Principal, { kind: "side_control" }>;
export type ApiKeyPrincipal = Extract<Principal, { kind: "api_key" }>;
