/**
 * What may reach the store as text or JSON, the same on both databases: PostgreSQL cannot store
 * NUL, and a lone surrogate would be stored as U+FFFD, so two distinct values could collide and an
 * echo differ from what was stored. Prototype keys are refused because parsing drops them silently,
 * and numbers beyond a double because they parse as infinities, which serialise as null.
 */

/** The deepest nesting accepted in a free-form JSON document (`details` of a status): 32 levels. */
export const MAX_JSON_DEPTH = 32;

/** Well-formed Unicode (no lone surrogate) without NUL. */
export function isStorableText(s: string): boolean {
  return s.isWellFormed() && !s.includes("\u0000");
}

export const STORABLE_TEXT_MESSAGE = "must be well-formed Unicode without NUL characters";

export interface JsonProblem {
  path: Array<string | number>;
  message: string;
}

/**
 * The first reason a parsed JSON value may not be stored: nested deeper than `maxDepth`, a string
 * or key that is not storable text, a number that is not finite, or a `__proto__` key. Walks without recursion, so a hostile
 * depth cannot exhaust the stack.
 */
export function jsonProblem(value: unknown, maxDepth = MAX_JSON_DEPTH): JsonProblem | undefined {
  const stack: Array<{ value: unknown; depth: number; path: Array<string | number> }> = [{ value, depth: 0, path: [] }];
  while (stack.length > 0) {
    const { value: v, depth, path } = stack.pop()!;
    if (typeof v === "string") {
      if (!isStorableText(v)) return { path, message: STORABLE_TEXT_MESSAGE };
      continue;
    }
    if (typeof v === "number" && !Number.isFinite(v)) return { path, message: "numbers must be finite (within a double's range)" };
    if (v === null || typeof v !== "object") continue;
    if (depth >= maxDepth) return { path, message: `nested deeper than ${maxDepth} levels` };
    if (Array.isArray(v)) {
      for (const [i, item] of v.entries()) stack.push({ value: item, depth: depth + 1, path: [...path, i] });
      continue;
    }
    for (const [key, item] of Object.entries(v)) {
      if (key === "__proto__") return { path: [...path, key], message: "__proto__ is not allowed as a key" };
      if (!isStorableText(key)) return { path: [...path, key], message: `keys ${STORABLE_TEXT_MESSAGE}` };
      stack.push({ value: item, depth: depth + 1, path: [...path, key] });
    }
  }
  return undefined;
}

/**
 * `text` in pieces each at most `max` bytes as `measure` counts a string (UTF-8 by default; the
 * event bus counts JSON string forms), cut between characters.
 */
export function splitText(text: string, max: number, measure: (s: string) => number = Buffer.byteLength): string[] {
  if (measure(text) <= max) return [text];
  // What an empty piece counts already (a JSON string's quotes).
  const empty = measure("");
  const pieces: string[] = [];
  let piece = "";
  let bytes = empty;
  for (const ch of text) {
    const n = measure(ch) - empty;
    if (bytes + n > max) {
      pieces.push(piece);
      piece = "";
      bytes = empty;
    }
    piece += ch;
    bytes += n;
  }
  pieces.push(piece);
  return pieces;
}
