"""Word lists for the open-ended training prompts (creative writing and chat),
written for verispec's head training. They cover the same kinds of request as
the `creative` and `chat` bench workloads but deliberately avoid their
subjects (no lighthouse keepers, maple leaves, photosynthesis, HTTP vs HTTPS
and so on), so a head's benchmark numbers are not measured on its training
prompts. Combined by verispec.training.material, they give a few thousand
distinct prompts.
"""

FORMS = [
    "a short story", "a poem", "three haiku", "a limerick", "a sonnet", "a letter",
    "a diary entry", "a short speech", "a dialogue between two characters", "a fairy tale",
    "a news report from the year 2300", "song lyrics with a chorus", "a product description",
    "a travel blog post", "a bedtime story", "a dramatic monologue", "a fable with a moral",
    "the opening paragraph of a mystery novel", "a recipe written as a poem",
    "a radio advertisement", "a postcard message", "a museum placard", "a toast for a wedding",
    "a weather forecast in verse",
]

SUBJECTS = [
    "a robot who wants to learn to paint", "the last tram of the night",
    "a village where it never stops snowing", "an astronaut growing tomatoes",
    "a cat who manages a hotel", "a clock that runs backwards", "two rival ice-cream vans",
    "a forgotten umbrella on a train", "a dog who becomes mayor", "the first day at a new school",
    "a lost glove looking for its pair", "a garden on a rooftop",
    "a detective who is afraid of the dark", "an owl that cannot sleep at night",
    "a city built on stilts", "a violin found in an attic", "a grandfather's pocket watch",
    "a storm over a wheat field", "a spaceship made of wood", "the smell of rain on hot pavement",
    "a penguin who hates the cold", "a chess match that lasts a hundred years",
    "a bridge that talks to travellers", "a tiny island with one tree",
    "a baker who can taste memories", "a river that flows uphill", "a museum guard's secret",
    "an elephant learning to skate", "the quiet hour before sunrise",
    "a postman on his final round", "a kite that escapes into the clouds",
    "a mountain that moves one step a year", "a scarecrow who makes friends with crows",
    "a submarine crew that finds a singing whale", "a tower made of glass bottles",
    "an inventor's failed machines", "a snowman in July", "a market that opens only at midnight",
    "a fox who collects buttons", "the moon taking a day off", "a map that redraws itself",
    "a bicycle journey across a desert of salt", "a pair of old boots", "a choir of frogs",
    "a train station at the edge of the world", "a girl who can speak to bees",
    "a ship in a bottle that wants to sail", "a volcano with stage fright",
    "a teapot that tells fortunes", "an empty theatre", "a squirrel planning a heist",
    "autumn in a busy city", "a dragon who collects teacups", "a message in a bottle",
    "a firefly lost in a lantern shop", "a tortoise running a marathon",
    "the first snowfall of the year", "a haunted vending machine",
    "a painter who can only use blue", "a comet passing over a farm",
]

CONSTRAINTS = [
    "", " Keep it under 200 words.", " Use vivid sensory details.", " Make it funny.",
    " Write it for young children.", " Give it a surprising ending.", " Use a hopeful tone.",
    " Write it in the first person.",
]

CREATIVE_TEMPLATES = [
    "Write {form} about {subject}.{constraint}",
    "Could you write {form} about {subject}?{constraint}",
    "Please compose {form} inspired by {subject}.{constraint}",
]

CONCEPTS = [
    "a black hole", "compound interest", "the immune system", "machine learning",
    "plate tectonics", "the water cycle", "supply and demand", "a vaccine", "blockchain",
    "the greenhouse effect", "natural selection", "a credit score", "quantum computing",
    "the stock market", "an index fund", "a recursive function", "DNA", "the speed of sound",
    "an electric motor", "a neural network", "the placebo effect", "a mortgage", "a sonnet",
    "impressionism", "the Renaissance", "an encryption key", "a compiler", "a hash table",
    "cloud computing", "a solar eclipse", "the Pythagorean theorem", "a prime number", "gravity",
    "tides", "an earthquake", "climate change", "a carbon footprint", "the circulatory system",
    "metabolism", "a virus", "a democracy", "a budget deficit", "opportunity cost", "a hypothesis",
    "the scientific method", "a version control system", "an operating system", "a database index",
    "unit testing", "open-source software", "a rainbow", "a hurricane", "the aurora borealis",
    "fermentation", "a calorie",
]

CONCEPT_TEMPLATES = [
    "What is {x}?", "Explain {x} in simple terms.", "Why does {x} matter?",
    "Can you give me an everyday example of {x}?", "How would you explain {x} to a ten-year-old?",
]

TASKS = [
    "make a good cup of tea", "start running as a beginner", "clean a cast-iron pan",
    "write a cover letter", "learn to touch type", "keep houseplants alive", "organize my closet",
    "save money on groceries", "prepare for a long hike", "improve my handwriting",
    "make friends in a new city", "study for an exam", "stay focused while working from home",
    "make a simple tomato sauce", "change a flat bicycle tire", "read a scientific paper",
    "start a vegetable garden", "plan a birthday party", "take better photos with a phone",
    "back up my computer", "sort a dictionary by value in Python", "read a CSV file in Python",
    "write a for loop in JavaScript", "center a div with CSS", "find large files on Linux",
    "create a virtual environment in Python", "remove duplicates from a list in Python",
    "ask my manager for feedback", "give a short presentation", "train a puppy to sit",
    "make bread without yeast", "reduce my screen time", "choose a laptop for programming",
    "write a haiku", "negotiate a salary", "start journaling", "fold a fitted sheet",
]

TASK_TEMPLATES = [
    "How do I {x}?", "What's the best way to {x}?", "Give me step-by-step instructions to {x}.",
]

PAIRS = [
    ("a list", "a tuple in Python"), ("weather", "climate"), ("a virus", "a bacterium"),
    ("RAM", "storage"), ("a simile", "a metaphor"), ("stocks", "bonds"),
    ("baking soda", "baking powder"), ("a crocodile", "an alligator"), ("speed", "velocity"),
    ("a latte", "a cappuccino"), ("Python", "JavaScript"), ("a process", "a thread"),
    ("empathy", "sympathy"), ("a lake", "a pond"), ("affect", "effect"),
    ("a comet", "an asteroid"), ("git merge", "git rebase"), ("a loan", "a lease"),
    ("mean", "median"), ("a frog", "a toad"),
]

ADVICE = [
    "staying motivated to exercise", "writing clear emails", "sleeping better on a trip",
    "learning to cook", "keeping a tidy desk", "reading more books", "public speaking",
    "working in a team", "learning a musical instrument", "managing stress before a deadline",
    "eating more vegetables", "making a long drive less tiring", "writing readable code",
    "remembering people's names",
]

EMAILS = [
    ("my landlord", "a leaking kitchen tap"), ("a colleague", "rescheduling our weekly call"),
    ("my team", "a new coffee machine in the office"),
    ("a teacher", "my child's absence on Friday"), ("a customer", "a delayed order"),
    ("my neighbour", "a package I received by mistake"),
    ("a professor", "an extension for an assignment"), ("a friend", "thanks for helping me move"),
]
