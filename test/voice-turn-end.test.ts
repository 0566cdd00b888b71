/**
 * The end-of-turn rules (src/voice/turn-end.ts, voice.md §7): a table of phrases as a recogniser
 * gives them at a pause, each with the class the rules must give it.
 */
import assert from "node:assert/strict";
import { describe, test } from "node:test";
import { contentWords, englishRules, turnEndSilence } from "../src/voice/turn-end.ts";

const FINISHED = `
What time is it?
What time is it
What's the weather like today?
What's the weather tomorrow?
How are you?
How are you doing today?
Where is the nearest pharmacy?
Who wrote Pride and Prejudice?
When does the store close?
Why is the sky blue?
Which one is cheaper?
How much does it cost?
How far is the moon?
How do I make pancakes?
What are you looking for?
Where are you from?
Who did you talk to?
What is it made of?
Can you help me?
Can you help me with my homework?
Could you repeat that?
Would you like some tea?
Is it going to rain?
Is it raining outside?
Are you there?
Do you know any jokes?
Does this bus go downtown?
Did you hear that?
Will it be sunny tomorrow?
Should I bring an umbrella?
Have you seen my keys?
Has the package arrived?
Is the oven on?
Are the lights off?
Set a timer for twenty minutes.
Set a timer for twenty minutes
Set an alarm for seven tomorrow morning.
Turn off the lights.
Turn on the kitchen lights
Turn the volume down.
Play some jazz.
Play the next song.
Stop the music.
Pause the podcast.
Resume playback.
Tell me a joke.
Tell me a story about dragons.
Call my mother.
Open the garage door.
Close the blinds.
Show me the forecast.
Start the dishwasher.
Cancel my alarm.
Remind me to buy milk tomorrow.
Read me the news.
Switch to the living room speaker.
Give me a recipe for soup.
Make it warmer.
Add eggs to my shopping list.
Remove milk from the list.
Send a message to Sam.
Find a good restaurant nearby.
Check my calendar.
Skip this song.
Mute the television.
Repeat the last sentence.
Translate good morning into French.
Spell necessary.
Search for flights to Paris.
Lock the front door.
Unlock the back door.
Dim the lights to half.
Increase the volume.
Lower the temperature by two degrees.
Wake me up at six.
Describe a black hole.
Explain photosynthesis.
Define serendipity.
List my reminders.
Count to ten.
Convert five miles to kilometres.
Please turn off the lights.
Please set a timer for ten minutes.
Can you turn on the radio?
Could you please play some music?
Let's play a game.
Stop.
Pause.
Cancel.
Next.
Thank you.
Thanks.
Thank you very much.
Goodbye.
Bye.
Hello.
Hi.
Good morning.
Good night.
Never mind.
That's all.
That's it.
No thanks.
Yes.
No.
Okay.
Sure.
A coffee, please.
Two tickets please.
Yes, I can.
No, it isn't.
Yeah I do.
What do you think?
What would you like?
How old are you?
What day is it today?
Who is the president of France?
What's two plus two?
What's five times five?
How do you spell rhythm?
Got it.
Sounds good.
I don't know.
Of course.
Perfect.
`;

const UNFINISHED = `
Set a timer for
Please set a timer for
Set an alarm for
Turn off the
Turn on the
Play some music by
I want to go to the
I went to the store and
I went to the store and then
Tell me about
Tell me
Show me
Give me
Let me
What's the weather in
What is the capital of
Remind me to
Remind me to call
Send a message to
Call my
Add milk and
Add milk, eggs and
I need a
I need an
I'd like a
Book a table for
The meeting is at
My number is five five five
My number is 555 12
It costs four hundred
It costs twenty
Set a timer for twenty
The code is one two three
The temperature is seventy
Set the thermostat to sixty
About
What
Where
Why
How
When
Which
Who
What about
So what
And
But
So
Because
Well
Um
Uh
Hmm
Erm
I think
I think that
I guess
I wonder if
I wonder
I mean
I want
I want to
I need to
I'm going to
I'm trying to
I was wondering whether
You know
It's like
It was kind of like
Can you
Could you
Would you
Can you please
Could you please
I can't remember if
It depends on
Look up the
Search for the
Find me a
Find me some
Put it on the
Move it to the
Between the
Before the
After the
During the
The one with the
The thing is
The problem is that
If it rains
If it rains tomorrow and
When I get home
When I get home, can you, um
Unless
Until
Although
While I was
Since
It was
They were
We should
You could
I have
I had
Maybe we could
He said that
She told me that
There was a
There is an
Do you know
Do you think
Is it
Are there any
What is
Where's the
How many
How much is the
Which of these
Who is
Tell me something about
Turn the volume up to
Let's go to the
Read me my
Text my
Open the
Cancel the
And also
And then
Or
Or maybe
Plus
Than
As well as
With
From
Into
Over the
Near
Per
Via
Against the
Toward the
Through
Without
It's about
One of the
Some of my
Each of the
Every
Another
Any of
Their
Our
My
Your
His
Her
Its
A
An
The
`;

const NEUTRAL = `
I went to the store yesterday.
The weather is nice today.
My name is Alice.
I like apples.
That was a good movie.
We are going camping next week.
It is cold outside.
The kids are asleep.
I just got home.
She plays the violin.
The train was late again.
Dinner is ready.
I finished the report.
My sister lives in Boston.
The garden looks lovely.
I forgot my umbrella.
The coffee is too hot.
We had pasta for dinner.
I saw a bird in the garden.
It rained all night.
The meeting went well.
My phone battery is low.
I am hungry.
I am tired.
He is at work.
The cat is sleeping on the sofa.
Today is my birthday.
I read a book last night.
The museum opens at nine.
We won the game.
I lost my keys.
This soup tastes great.
The printer is broken.
My flight lands at noon.
It smells like rain.
Everything is fine.
The baby is crying.
The store was closed.
I have a headache.
My car needs new tires.
The lecture was boring.
I'm back.
I'm ready.
I'm home.
It's late.
It's sunny.
Tomorrow is Friday.
Our team lost.
Nothing happened.
The dog barked all night.
My brother called me.
The package came today.
I called the doctor.
I painted the fence.
I agree.
Maybe later.
Not now.
Later.
Interesting.
Fair enough.
I walked to work.
The film starts soon.
It was my fault.
My tea is cold.
The bread is fresh.
The bus is full.
I miss summer.
The water is boiling.
The sun is setting.
I feel better.
I love this song.
You are right.
We did it.
They left early.
Everyone is here.
`;

function lines(block: string): string[] {
  return block
    .split("\n")
    .map((l) => l.trim())
    .filter(Boolean);
}

const TABLE: Array<[string, "finished" | "unfinished" | "neutral"]> = [
  ...lines(FINISHED).map((p) => [p, "finished"] as [string, "finished"]),
  ...lines(UNFINISHED).map((p) => [p, "unfinished"] as [string, "unfinished"]),
  ...lines(NEUTRAL).map((p) => [p, "neutral"] as [string, "neutral"]),
];

describe("end of turn: the English rules (voice.md §7)", () => {
  test(`a table of ${TABLE.length} phrases: finished, unfinished or neither`, () => {
    assert.ok(TABLE.length >= 300, `${TABLE.length} phrases`);
    const wrong = TABLE.filter(([p, want]) => englishRules.shape(p) !== want).map(
      ([p, want]) => `${JSON.stringify(p)}: ${englishRules.shape(p)}, want ${want}`,
    );
    assert.deepEqual(wrong, []);
  });

  test("the same words without the recogniser's punctuation keep their class (but a stranded preposition needs the question mark)", () => {
    const wrong = TABLE.filter(([p, want]) => {
      if (/\?$/.test(p)) return false;
      return englishRules.shape(p.replace(/[.,!]/g, "")) !== want;
    }).map(([p]) => p);
    assert.deepEqual(wrong, []);
  });

  test("languages other than English: always neither (silence_ms); English by its tag or by default", () => {
    const t = { silence_ms: 400, finished_silence_ms: 250, unfinished_silence_ms: 1200 };
    assert.equal(turnEndSilence("What time is it?", "es", t), 400);
    assert.equal(turnEndSilence("Set a timer for", "fr-CA", t), 400);
    assert.equal(turnEndSilence("What time is it?", "en-GB", t), 250);
    assert.equal(turnEndSilence("What time is it?", undefined, t), 250);
    assert.equal(turnEndSilence("Set a timer for", "en", t), 1200);
    assert.equal(turnEndSilence("The weather is nice today.", "en", t), 400);
    assert.equal(turnEndSilence(undefined, "en", t), 1200, "no words known yet: they are awaited, at most unfinished_silence_ms");
    assert.equal(turnEndSilence(undefined, "de", t), 400);
    assert.equal(turnEndSilence("", "en", t), 400);
  });

  test("a turn-end model can replace the rules", () => {
    const t = { silence_ms: 400, finished_silence_ms: 250, unfinished_silence_ms: 1200 };
    assert.equal(turnEndSilence("anything", "en", t, { shape: () => "unfinished" }), 1200);
  });

  test("fillers and backchannels are no words of a barge-in; anything else is", () => {
    for (const s of [
      "Hm.",
      "Mm-hm.",
      "Mmhmm.",
      "Mhm",
      "Uh-huh",
      "yeah",
      "Okay.",
      "right",
      "Hmm hmm.",
      "Oh, yes.",
      "um, uh",
      "Mmh and mh and m.",
      "Hmmmm.",
      "Uhm.",
      // Moonshine's spellings of a hum with a break (issue 50).
      "Mm-mm.",
      "Hm-hm, m-hm.",
      "",
    ])
      assert.equal(contentWords(s), 0, s);
    assert.equal(contentWords("Wait."), 1);
    assert.equal(contentWords("Yeah, but what about tomorrow?"), 4);
    assert.equal(contentWords("Stop!"), 1);
    assert.equal(contentWords("And then?"), 2);
    assert.equal(contentWords("Mm, no."), 1);
  });
});
