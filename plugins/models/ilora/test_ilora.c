#include "pl_test.h"
#include "ilora.h"
int main(void) { return 0; }
