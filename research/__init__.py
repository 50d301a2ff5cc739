"""Research code: the studies' drivers and analyses, kept out of the installed ``prorag`` package."""
