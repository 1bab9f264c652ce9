STOPWORDS = frozenset("a an and the of to in is it".split())
