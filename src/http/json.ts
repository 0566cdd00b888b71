/**
 * Headers of every JSON response. Passed to `c.json` so that the type is set as the response is
 * built (the Node adapter then writes it in one piece, as it does any response built whole).
 */
export const JSON_UTF8 = { "Content-Type": "application/json; charset=utf-8" };

export const JSON_CONTENT_TYPE = JSON_UTF8["Content-Type"];
