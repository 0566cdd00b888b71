import type { Caller } from "../../ai/caller.ts";
import type { Catalog, CatalogEntry } from "../../ai/catalog.ts";
import { OpenAIError } from "./errors.ts";

function audioModel<K extends "speech" | "transcription">(catalog: Catalog, caller: Caller, id: string, kind: K): Extract<CatalogEntry, { kind: K }> {
  const entry = catalog.get(caller, id);
  if (!entry) throw new OpenAIError(404, `The model \`${id}\` does not exist or you do not have access to it.`, { param: "model", code: "model_not_found" });
  if (entry.kind !== kind) throw new OpenAIError(400, `\`${id}\` is not a ${kind} model.`, { param: "model", code: "invalid_model" });
  return entry as Extract<CatalogEntry, { kind: K }>;
}

export const speechModel = (catalog: Catalog, caller: Caller, id: string) => audioModel(catalog, caller, id, "speech");
export const transcriptionModel = (catalog: Catalog, caller: Caller, id: string) => audioModel(catalog, caller, id, "transcription");
