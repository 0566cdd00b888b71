import { ApiError, errorResponse } from "../errors.ts";
import { bodyLimit } from "../middleware.ts";

/** The Public API's request body limit on JSON routes (the offer route will take 256 KiB). */
export const JSON_BODY_LIMIT = 64 * 1024;

/** The refusal of a body over `JSON_BODY_LIMIT`. */
export const payloadTooLarge = () => new ApiError(413, "PAYLOAD_TOO_LARGE", `request body is over ${JSON_BODY_LIMIT} bytes`);

/** The first middleware of every Public API route: 413 `PAYLOAD_TOO_LARGE` over `JSON_BODY_LIMIT` (native routes check `bodyWithinLimit` with the same). */
export const jsonBodyLimit = bodyLimit(JSON_BODY_LIMIT, (c) => errorResponse(c, payloadTooLarge()));
