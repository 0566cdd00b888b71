import type { FakeUpstream, Reply } from "./fake-upstream.ts";

/** The rewrite's request as the scripted model reads it. */
export interface RewriteRequest {
  instructions: string;
  memory: string;
  conversation: Array<{ user?: string; assistant?: string }>;
}

/** The memory rewrite request in `body`, when it is one (its system message is the rewrite's instructions). */
export function rewriteOf(body: Record<string, any>): RewriteRequest | undefined {
  const [system, user] = body.messages ?? [];
  if (body.stream || system?.role !== "system" || !String(system.content).startsWith("You keep the notes")) return undefined;
  const data = JSON.parse(user.content) as { memory: string; conversation: RewriteRequest["conversation"] };
  return { instructions: system.content, memory: data.memory, conversation: data.conversation };
}

/** What the scripted model writes: the memory so far, then one sentence per user line. */
export function scriptedMemory(r: RewriteRequest): string {
  const heard = r.conversation.flatMap((l) => (l.user ? [`Heard: ${l.user.trim().replace(/[.!?]*$/, "")}.`] : []));
  return [r.memory, ...heard].filter(Boolean).join(" ");
}

/**
 * A scripted model over HTTP: rewrite requests are answered with `scriptedMemory` (after `gate`, when
 * given, for holding one in flight), conversation turns with `reply` (default "Okay.").
 */
export function scriptMemoryModel(upstream: FakeUpstream, o: { reply?: string; gate?: (r: RewriteRequest) => Promise<unknown> | undefined } = {}): void {
  upstream.defaultReply = (body): Reply => {
    const rewrite = rewriteOf(body);
    if (!rewrite) return { content: o.reply ?? "Okay." };
    const wait = o.gate?.(rewrite);
    return { content: scriptedMemory(rewrite), ...(wait ? { wait } : {}) };
  };
}

/** The agents of a memory test: `talker` remembers, `plain` does not. */
export function memoryConfig(upstreamUrl: string, memory: { max_chars?: number; idle_ms?: number } = {}) {
  return {
    providers: [{ id: "local", kind: "openai-compatible" as const, base_url: upstreamUrl, max_retries: 0 }],
    models: [{ id: "chat", kind: "chat" as const, provider: "local", upstream_model: "scripted" }],
    agents: [
      { id: "talker", model: "chat", instructions: "You speak briefly.", voice: "alloy", memory: { enabled: true, max_chars: 2_000, ...memory } },
      { id: "plain", model: "chat", instructions: "You speak briefly.", voice: "alloy" },
    ],
    voice: { agent: "talker", max_reply_delay_ms: 60_000 },
  };
}
