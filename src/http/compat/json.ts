import type { Context } from "hono";
import { OpenAIError } from "./errors.ts";

/** The request body as JSON; any content type is read, as OpenAI does. */
export async function readJson(c: Context): Promise<unknown> {
  const text = await c.req.text();
  if (!text.trim()) throw new OpenAIError(400, "The request body is empty: send a JSON object.", { code: "invalid_json" });
  try {
    return JSON.parse(text);
  } catch {
    throw new OpenAIError(400, "We could not parse the JSON body of your request.", { code: "invalid_json" });
  }
}
