/**
 * End of turn by what was said (voice.md §7): the words heard so far at a pause look finished (a
 * complete question or command), unfinished (they stop on a conjunction, an article, a preposition,
 * a filler, a number being said, a question word alone…) or neither; the silence that ends the turn
 * follows. Rules for English; other languages always wait `silence_ms`.
 *
 * A turn-end model can take the rules' place: anything with `shape(text, language)` will do.
 */

export type TurnShape = "finished" | "unfinished" | "neutral";

/** Judges the words of a turn so far. */
export interface TurnEndModel {
  shape(text: string, language?: string): TurnShape;
}

/** The silences of voice.md §7 (`voice.turn`). */
export interface TurnSilences {
  silence_ms: number;
  finished_silence_ms: number;
  unfinished_silence_ms: number;
}

/**
 * The silence (ms) that ends a turn whose words so far are `text`. Undefined: the words are not
 * known yet (being recognised): at most `unfinished_silence_ms` is waited for them, and the caller
 * asks again when they come. The reply needs them anyway, so waiting for them costs nothing.
 * Languages other than English: `silence_ms` always.
 */
export function turnEndSilence(text: string | undefined, language: string | undefined, t: TurnSilences, model: TurnEndModel = englishRules): number {
  if (!isEnglish(language)) return t.silence_ms;
  if (text === undefined) return t.unfinished_silence_ms;
  const shape = model.shape(text, language);
  return shape === "finished" ? t.finished_silence_ms : shape === "unfinished" ? t.unfinished_silence_ms : t.silence_ms;
}

/** English, or no language named (the embedded recogniser hears English only). */
export function isEnglish(language: string | undefined): boolean {
  return language === undefined || /^en(-|$)/i.test(language);
}

/** The words of a text, lower case, apostrophes kept ("what's"), hyphens kept inside a word ("mm-hm"). */
export function words(text: string): string[] {
  return (
    text
      .toLowerCase()
      .replace(/[’‘]/g, "'")
      .match(/[\p{L}\p{N}]+(?:['-][\p{L}\p{N}]+)*/gu) ?? []
  );
}

const set = (list: string) => new Set(list.split(/\s+/).filter(Boolean));

/** Fillers and backchannels (voice.md §7): alone, they are never a barge-in. */
/** (Recognisers spell them many ways: "mm-hmm", "mmhmm", "mhm"…) */
export const BACKCHANNELS = set(
  `hm hmm hmmm mm mmm mhm mhmm mmhm mmhmm mm-hm mm-hmm hm-hm uh-huh uhhuh uh-uh huh uh um umm uhm er erm ah aha oh ooh yeah yea yep yes okay ok right`,
);

/** A hum however a recogniser spells it ("mmh", "mh", "hmmm", "uhm", "m", "mm-mm", "hm-hm"). */
const HUM = /^(?:[mhn]+(?:-[mhn]+)*|u+[hm]+|[ae]+h+|[ae]+m+)$/;
/** Words that join other words and say nothing alone ("mmh and mh"). */
const JOINERS = new Set(["and", "or"]);

/** How many words of `text` are not fillers, backchannels or hums (joiners count only beside another word). */
export function contentWords(text: string): number {
  return saidWords(text).length;
}

/** Those words of `text` (lower case, in order); none when only joiners are left. */
export function saidWords(text: string): string[] {
  const said = words(text).filter((w) => !BACKCHANNELS.has(w) && !HUM.test(w));
  return said.some((w) => !JOINERS.has(w)) ? said : [];
}

/** Those words without the joiners they begin with ("and in nature" → "in nature"). */
export function leadingSaid(text: string): string[] {
  const said = saidWords(text);
  const from = said.findIndex((w) => !JOINERS.has(w));
  return from < 0 ? [] : said.slice(from);
}

const CONJUNCTIONS = set(`and or but so because cause 'cause if when while although though unless until since that which whereas whether nor than as plus`);
const ARTICLES = set(`a an the`);
const DETERMINERS = set(`my your his her our their its this these those some any every each another other such no`);
const PREPOSITIONS = set(
  `of to for in on at by with from into onto about over under after before between through during without within around near toward towards against per via upon across behind beside besides beyond among`,
);
const FILLERS = set(`um umm uhm uh er erm ah hmm like well`);
const AUXILIARIES = set(
  `is are was were am be been being do does did have has had can could will would should shall may might must i'm you're we're they're it's that's there's what's i'd i'll isn't aren't wasn't weren't don't doesn't didn't can't couldn't won't wouldn't shouldn't haven't hasn't`,
);
/** Verbs that want what follows ("I want", "I think", "tell me about"). */
const LEADING_VERBS = set(`want wanna need think guess wonder mean say said tell know like love hate hope wish try trying gonna going let`);
const QUESTION_WORDS = set(`what who whom whose where when why how which what's where's who's how's when's why's`);
const TENS = set(`twenty thirty forty fifty sixty seventy eighty ninety`);
const SCALES = set(`hundred thousand million billion point dot dash minus times divided`);
const DIGIT_WORDS = set(`zero oh one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen seventeen eighteen nineteen`);
/** Verbs that begin a command ("set a timer for twenty minutes"). */
const COMMANDS = set(
  `set turn play stop pause resume tell call open close show start cancel remind read switch give make add remove delete send find check skip mute unmute repeat answer translate spell search book order lock unlock dim brighten increase decrease raise lower wake text message navigate take put describe explain define help list schedule record let's lets go continue count calculate convert look bring get write note save clear reset`,
);
/** Whole turns that are complete on their own. */
const COMPLETE = new Set([
  "yes",
  "no",
  "yeah",
  "nope",
  "okay",
  "ok",
  "sure",
  "thanks",
  "thank you",
  "thank you very much",
  "thanks a lot",
  "goodbye",
  "bye",
  "bye bye",
  "hello",
  "hi",
  "hey",
  "good morning",
  "good night",
  "good evening",
  "never mind",
  "nevermind",
  "that's all",
  "that's it",
  "that's all for now",
  "no thanks",
  "no thank you",
  "stop",
  "pause",
  "cancel",
  "resume",
  "continue",
  "next",
  "skip",
  "again",
  "quiet",
  "enough",
  "louder",
  "softer",
  "perfect",
  "great",
  "cool",
  "got it",
  "sounds good",
  "of course",
  "exactly",
  "correct",
  "i see",
  "i don't know",
  "not really",
]);
const POLITE = set(`please can could would will`);
/** Clauses that need another after them ("if it rains…", "when I get home…"). */
const SUBORDINATORS = set(`if when because unless until although though while since whenever once`);
/** Verbs that want an object after "to" ("remind me to call…"). */
const TRANSITIVE = set(`call buy get make send tell set play turn add find book order check take put give bring write read text ask pick`);
const SUBJECTS = set(`i you we they he she it`);

/** The English rules. */
export const englishRules: TurnEndModel = {
  shape(text: string, language?: string): TurnShape {
    if (!isEnglish(language)) return "neutral";
    const w = words(text);
    if (w.length === 0) return "neutral";
    const last = w.at(-1)!;
    const before = w.at(-2);
    const question = /\?\s*$/.test(text);
    const joined = w.join(" ");
    if (COMPLETE.has(joined)) return "finished";
    // A question word alone, or one with a filler ("what about", "so how").
    if (w.every((x) => QUESTION_WORDS.has(x) || FILLERS.has(x) || CONJUNCTIONS.has(x) || x === "about" || x === "exactly")) return "unfinished";
    // "and then", "or something like" …
    if (last === "then" && before !== undefined && CONJUNCTIONS.has(before)) return "unfinished";
    if (FILLERS.has(last) && !(last === "like" && question) && !(last === "well" && w.length > 2 && before !== "as")) return "unfinished";
    if (last === "know" && before === "you" && w.length > 2 && !question) return "unfinished";
    // "that" ends a question ("Did you hear that?") as a pronoun, a statement ("I think that") as a conjunction.
    if (last === "that" && question) return "finished";
    if (CONJUNCTIONS.has(last) || ARTICLES.has(last)) return "unfinished";
    // "And also…", "Or maybe…".
    if ((w[0] === "and" || w[0] === "or" || w[0] === "but" || w[0] === "plus") && w.length <= 2) return "unfinished";
    if (DETERMINERS.has(last) && !(last === "this" || last === "that" || last === "those" || last === "these" || last === "no")) return "unfinished";
    if (PREPOSITIONS.has(last)) {
      // "What are you looking for?": a question may end on its preposition.
      if (question && (QUESTION_WORDS.has(w[0]!) || AUXILIARIES.has(w[0]!)) && w.length >= 3) return "finished";
      return "unfinished";
    }
    // A number being said: "twenty…", "four hundred…", "five five five one…".
    if (TENS.has(last) || SCALES.has(last)) return "unfinished";
    if (isNumber(last) && before !== undefined && isNumber(before)) return "unfinished";
    if (AUXILIARIES.has(last)) {
      // "Yes I can.", "No it isn't.": short answers end on their auxiliary.
      if ((w[0] === "yes" || w[0] === "no" || w[0] === "yeah") && w.length <= 4) return "finished";
      if (question && w.length >= 3) return "finished";
      return "unfinished";
    }
    if (LEADING_VERBS.has(last) && !question) return "unfinished";
    if (TRANSITIVE.has(last) && before === "to" && !question) return "unfinished";
    if (last === "me" && (before === "tell" || before === "show" || before === "give" || before === "let")) return "unfinished";
    // "Can you…", "Is it…".
    const opener = (x: string) => POLITE.has(x) || AUXILIARIES.has(x) || QUESTION_WORDS.has(x);
    if (SUBJECTS.has(last) && w.length <= 3 && w.slice(0, -1).every(opener) && !question) return "unfinished";
    if (last === "please" && w.slice(0, -1).every((x) => opener(x) || SUBJECTS.has(x))) return "unfinished";
    if (question && w.length >= 2) return "finished";
    if (QUESTION_WORDS.has(w[0]!)) {
      // A question without its mark has its verb near the front ("what time is it"); "how many", "which of these" do not yet.
      const verb = w.slice(1, 4).some((x) => AUXILIARIES.has(x));
      if (verb && w.length >= 3) return "finished";
      if (!verb && w.length <= 3) return "unfinished";
    }
    if (AUXILIARIES.has(w[0]!) && w.length >= 3 && SUBJECTS.has(w[1]!)) return "finished";
    // "If it rains", "When I get home": the clause that matters is still to come.
    if (SUBORDINATORS.has(w[0]!)) return "unfinished";
    // A command: an imperative verb, perhaps after "please" or "can you".
    if (isCommand(w)) return "finished";
    if (last === "please" && w.length >= 2) return "finished";
    return "neutral";
  },
};

function isNumber(word: string): boolean {
  return /^\d+$/.test(word) || DIGIT_WORDS.has(word) || TENS.has(word);
}

function isCommand(w: string[]): boolean {
  let i = 0;
  while (i < w.length && (POLITE.has(w[i]!) || w[i] === "you" || w[i] === "just" || w[i] === "now" || w[i] === "hey")) i++;
  return i < w.length && COMMANDS.has(w[i]!) && w.length - i >= 2;
}
