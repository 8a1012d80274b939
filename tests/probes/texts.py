"""Example answers for the probe tests: about rain (positive) and about other things (negative)."""

POSITIVE = [
    "Rain fell all night, drumming on the roof and filling the gutters.",
    "The rain started as a drizzle and turned into a heavy downpour by noon.",
    "Grab an umbrella: the forecast says rain and thunderstorms this afternoon.",
    "Raindrops slid down the window while the storm rolled over the hills.",
    "After weeks of drought, the rain finally soaked the dry fields.",
    "We waited under the bridge until the pouring rain eased.",
    "Spring rain makes the puddles deep and the grass bright green.",
    "The monsoon rains flooded the streets of the city.",
    "A light rain kept falling, and the air smelled of wet earth.",
    "Dark clouds gathered, and soon the rain came down in sheets.",
    "Her raincoat was soaked after walking home in the rain.",
    "The steady rain on the tent lulled the campers to sleep.",
]
NEGATIVE = [
    "Algebra uses letters to stand for numbers in equations.",
    "The train left the station at nine and reached the coast by noon.",
    "My grandmother bakes bread every Sunday morning.",
    "The museum has a new exhibit of old maps and globes.",
    "Chess players plan several moves ahead.",
    "The laptop needs a software update before the meeting.",
    "Mountains in the north are popular with hikers in summer.",
    "She practised the violin for an hour after school.",
    "The library opens at eight and closes at six.",
    "Friendship grows when people share time and trust.",
    "A good recipe lists every ingredient in order.",
    "The rocket carried a satellite into orbit.",
]
