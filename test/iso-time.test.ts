import assert from "node:assert/strict";
import { test } from "node:test";
import { isoTime, parseTime } from "../src/domain/iso-time.ts";

/** The status document's `reported_at` is written and read by these instead of `Date`: they must agree with it everywhere. */
const DAY = 86_400_000;
const END = 253_402_300_800_000;

test("isoTime writes what toISOString writes, and parseTime reads it back, across the whole range and its edges", () => {
  const times = [0, -0, 1, DAY - 1, DAY, END - 1, 1_700_000_000_000, 1_700_000_000_999, 951_782_400_000 /* 2000-02-29 */];
  for (let i = 0; i < 50_000; i++) times.push(Math.floor(Math.random() * END));
  // Runs of consecutive milliseconds across day boundaries, so the kept day changes under them.
  for (let d = 19_000; d < 19_003; d++) for (let k = -3; k < 3; k++) times.push(d * DAY + k);
  for (const ms of times) {
    const text = new Date(ms).toISOString();
    assert.equal(isoTime(ms), text, `isoTime(${ms})`);
    assert.equal(parseTime(text), Date.parse(text), `parseTime(${text})`);
  }
  // Outside the fast range, and values Date rounds or refuses.
  for (const ms of [-1, -DAY - 7, END, END + 123, 8.64e15, -8.64e15, 1.5, 1_700_000_000_000.7])
    assert.equal(isoTime(ms), new Date(ms).toISOString(), `isoTime(${ms})`);
  assert.throws(() => isoTime(Number.NaN), RangeError);
  assert.throws(() => isoTime(8.64e15 + 1), RangeError);
});

test("parseTime reads any text as Date.parse does: offsets, other days, times out of range, junk", () => {
  const today = isoTime(1_700_000_000_000).slice(0, 11); // the day the parser keeps
  const texts = [
    `${today}22:13:20.123Z`,
    `${today}24:00:00.000Z`,
    `${today}24:30:00.000Z`,
    `${today}23:60:00.000Z`,
    `${today}23:59:60.000Z`,
    `${today}2a:13:20.123Z`,
    `${today}22:13:20.12aZ`,
    `${today}22:13:20.123z`,
    `${today}22-13-20.123Z`,
    `${today}22:13:20.123+`,
    `${today}22:13:20+02:00`,
    `${today}22:13:20.123+02:00`,
    `${today}22:13:20Z`,
    "2001-01-01T00:00:00.000Z",
    "2023-11-14T22:13:20.123-05:30",
    "+275760-09-13T00:00:00.000Z",
    "-000001-01-01T00:00:00.000Z",
    "not a time at all, 24 ch",
    "",
  ];
  for (const text of texts) assert.deepEqual(parseTime(text), Date.parse(text), `parseTime(${JSON.stringify(text)})`);
});
