"""English words for the `words` and `words-val` splits, and token words for the `tokens` split
(reterm_jax/tasks/pools.py).

1068 lower-case words of 3-8 letters, each seen at least 3 times in Python 3.11's
`pydoc_data.topics` (the language reference's English), minus every letter run of a pool item (so
no held-out value, nor a part of one, is among them) and a few words the task files use as keys.
Frozen here so the same seed writes the same tasks on any Python.
"""
WORDS = tuple("""
abc able about above absolute abstract accept accepted accepts access accessed accesses achieve
across act action active actual actually add added adding addition affect affects after again
against alias aliases align aligned alist alive all allow allowed allows almost along already
also although always and another any anything anywhere appear appears applied applies apply
approach are arg args argument around array asked assert assign assigned assigns asterisk async
attached attempt attempts attr auditing augop avoid await back bacon bad bar base based bases
basic because become becomes been before begins behaves behavior being below besides between bin
binary bind binding bindings binds bit bits bitwise block blocks body bool boolean both bottom
bound bounds bpnumber brace braces brackets break breaking breaks bubbles builds built builtin
builtins but bypassed byte bytecode bytes call callable called caller calling calls can cannot
capture case cased cases caught cause caused causes cell center centered certain chain chaining
change changed changes chars check checked checkers checking child class classdef classes clause
clauses cleanup clear cleared close cls code coercion colon column combined comma command
commands commas commonly compare compared compares compile compiled compiler complex compound
compute computed consider consists constant contain contains contents context contexts continue
contrast control convert converts coord copied copy cost could count create created creates
creating creation curly current custom cycle cycles cyclic data debug debugged debugger decimal
declare declared def default defaults define defined defines defining degree del delete deleted
deletion denote denotes depend depends derived describe desired detail details detected dict
dictview differ differs digit digits direct directly dishes display displays division does doesn
doing don done dots dotted double due during dynamic each earlier easier easily economy effect
eggs either element elements elif else empty emulate enabled enables enclosed encoding end ends
enforce ensure enter entered entire entries entry enum equal equality escape escaped escapes etc
evaluate even event every exact exactly examples except excess execute executed executes exist
existing exists exit exited exits exp explicit exponent expr extend extends external extra fact
fail failed failing fails failure fall falls fashion feature features field fields file filename
files fill fillchar filled final finally find finite first fixed flag float floating floor flow
follow followed follows foo for form formal format formats formed former forward found four
frame frames free from front full func funcdef funcname function further future garbage general
generate generic get gets getting give given gives global globals grammar greater group grouping
groups guard had hand handle handled handler handlers handles handling happen happened happens
has hash hashable have having header help hence here hex hint hints hook how however identity
ignore ignored illegal implicit implied implies imply import imported imposed improper include
included includes index indexed indexes indicate indices indirect inf infinite informal inherit
inherits input inputs insert inserted inserts inside inspect inst instance instead int integer
integers integral intended into invalid inverse invoke invoked invoking item items iter iterable
iterate iterated iterator its itself juice jump just keep keepends keeping key keys keyword
keywords kind kinds known kwargs kwds lambda language large larger last later latitude latter
lead leading least leaves leaving left length less letter letters level levels lexical library
like likely limited line lineno lines linked list listed listing lists literal literals loaded
loading local locale locally locals location locking logical long longer look looked looking
looks lookup lookups loop loops lower lst machine made make makes manager managers mangled many
mapped mapping mappings match matched matches matching math maxsplit may meaning means meet
meets member members memory message messages method methods might minus missing mix model
modified modifies modify module modules modulo more mortem most mostly much multiple must
mutable name named names ndigits nearest need needed needs negation negative neither nested
never new newline newly next nicely non nonlocal nonzero nor normal normally nosigint not
notation note nothing now number numbers numeric obj object objects obtain obtained occur
occurred occurs ocert oct octal off often old omitted once one only open operand operands
operates operator option optional options order ordered ordering ordinals original other out
outer output outside over override own owner package padding pair pairs param parent parents
part party pass passed passes passing pattern patterns pdb penguin per perform performs perhaps
piece pkg place placed plus point points position positive possible possibly post postpone power
powerful pre preceded precise prefix prefixed presence present preserve prevent previous primary
print printed printf printing prints priority private problem proceeds process produce produced
produces program programs prompt proper property proposal proposed protocol provide provided
provides public purely purpose purposes python quote quoted quotes raise raised raises raising
range rather raw reached read readrc real really reason reasons recent red refer referred refers
regular related relative release rely remain remind remove removed removes removing repeated
repeats replace replaced require required requires reserved resolved resource rest restart
result results retrieve return returned returns reuse reverse reversed rich right roughly rule
rules run running runtime said same sausage saved scope scopes scoping script searched second
section see selected selects self sense sep separate sequence series set sets setting several
shallow share shared shift should show shown shows side sign similar simple since single skip
skips slice slicing slightly slot slots smaller soft some soon sort sorted sorting sorts source
space spaces spacious spam special specific specify speed splits square stack standard star
starred start started starting starts state static stdin step steps still stop stopping stops
store stored storing str strict strictly stride string strings stripped style sub subclass
subject subtle succeed succeeds success such suffix suite suites sum supplied support supports
suppress swapped symbol symbols syntax sys system tab table take taken takes target targets
terms ternary test tested testing tests text than that the their them then there these they
third this those though three through thus tightly time times together too top total touch trace
trailing treated triple truth try tuple tuples turn type typed types typical typing unary
unbound under unequal unfilled unicode unique unless unlike until updated updates upon upper
usable usage use used useful user users uses using usual usually utf val valid value values
variable various vary version versions versus very via view virtual want warning was way ways
weak well were what when whenever where whether which while whose width wildcard will wishes
with within without word words work working works would wrapped wrapper writable write writes
written www yet yield yields you zero zeros
""".split())

# The `tokens` split's words: every lower-case token of two or more letters in the tiny tokenizer's
# vocabulary (reterm_jax/assets/tokenizer), minus every letter run of a pool item and the keys
# `host`, `port` and `name`. A model writes only the tokens its SFT rows made it write; English
# words leave some out (`amp`, the middle of `example`, was in none of the learning experiment's rows), these
# names have each of them whole (experiments/learning/notebook.md). Frozen, like WORDS; a test checks it
# against the tokenizer.
TOKEN_WORDS = tuple("""
ab able ac ace acebac acro actl ad ai ain ais al all alth ame ameter amp an and anges ant app apping
ar arg art as ase ask asoning assed assist assistant ast at ata ate ath ation atus aw awk bac bas
bash bj cal cat cd ce ception ch chive chmo chmod cho ck co com command content cri cription ct
ction ctl ctor ctual cur curl de des description dex di diff din echo ect ed en end er ery est ests
et etc ex exit fi fier fig fin find for function gain ge ges gin git gre grep hat he head heck hell
ho iable ied if iff ifi ified il ill im imp import in ing ink ip iq ire irector irectory ired is it
item items iter ith ive jq js json kdi ke la le lease led les lete lit ll llow lo local localhost ls
lst lstrip ly mand mat me ment min minal mis mission mkdi mkdir mo most mp mplete mpt ner nex nied
no nt obj object ol on one oning onse ontent oo ool op or ort orted ou our ous ow par parameter
parameters pe pec pected per perties pip plete plit pp print pro properties ps ption put py python
qu rais re reasoning rent requ required revi revitem rf ri rifier rin ring rint rip ritte rm rn ro
role ron ror ross rst run se sed si sing sion sist sort sp sponse ss ssa st stall stat string sv sw
sys system systemctl tar te ted tem ter terac test text th think thon ti ties tion tive tmp tool tp
ts tte ttp ty type ual ue uil ul ults ument un unction und ur uration us user usr ust ut utput ux
val value var ve vi vide viron wc xarg xt xz xzf ys ytest
""".split())
